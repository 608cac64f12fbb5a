// Package deploy holds the tests of relayd's shipped deployment artefacts:
// the kustomize base (deploy/base), its overlays (deploy/overlays: example,
// ha, nats-secure) and the NetworkPolicy Component, the Helm chart
// (deploy/helm/relayd), the Dockerfile and .dockerignore, and the NATS
// permission blocks of docs/DEPLOY.md (relayd's, its JWT form, without
// create rights, and a consumer's), each run against a real nats-server.
//
// The manifests are rendered with the real kustomize (pinned in
// tools/kustomize, built by `make kustomize-bin`) and the real helm (pinned
// in tools/helm, built by `make helm-bin`; the chart with its default
// values and with ci/all-options-values.yaml goes through the same static
// checks as the kustomize renders, and must render what they do for the
// same config) and applied to a real kube-apiserver (internal/testenv).
// The RBAC is proven, not assumed: the real relayd binary (`make build`)
// runs as the rendered ServiceAccount (of the base, and of the chart) with a
// token from the TokenRequest API, becomes ready, relays a change of every
// watched kind to a real NATS JetStream and writes its checkpoint. Then
// every single permission of the rendered Roles and ClusterRole is taken
// away in turn, and relayd must report exactly that permission (verb and resource)
// in its log, stay unready, and keep /healthz up. "list" is proven on a
// second apiserver with streaming lists turned off (on one that serves them,
// a snapshot start is authorized as "watch" alone); relayd's forbidden LIST
// is accepted in a weaker form until it keeps the apiserver's reason (see
// requireAPIServerTextForList).
//
// The static checks pin what the cluster cannot: no wildcards, no create, no
// secrets, list and watch on exactly what the shipped config watches, the
// restricted securityContext, and the Dockerfile building with the
// Makefile's flags and starting the way the Deployment expects.
package deploy
