// Package observability holds the tests of relayd's monitoring artefacts:
// the Grafana dashboard (deploy/grafana), the alert rules (deploy/prometheus),
// the kustomize monitoring component (deploy/monitoring) and the metrics
// reference table in docs/OPERATIONS.md. They run against real servers: etcd,
// kube-apiserver and NATS from internal/testenv, relayd in-process, and a real
// Prometheus (built from tools/prometheus by `make prometheus-bin`).
//
// How each alert is proven: `promtool test rules` shows that every alert
// fires when it should and stays quiet when it should not (thresholds and
// `for`). Against the real Prometheus scraping a real relayd, every alert
// expression must parse and evaluate, and the same expression with every
// comparison against a number literal removed (`up{...} == 0` becomes
// `up{...}`, `x > 600 and on (...) y == 1` becomes `x and on (...) y`) must
// return at least one series: so every metric name, label and matcher an alert
// relies on exists in what relayd really exposes. TestRunbooks: every alert
// links its runbook, a section of docs/OPERATIONS.md's "Alert runbooks"
// (by GitHub's heading anchors), and every runbook is an alert's.
package observability
