#!/usr/bin/env bash
# Builds prometheus and promtool from the tools/prometheus module (a
# build-only module of its own, so Prometheus's dependencies never move a
# version that the other tool builds depend on) into a cache folder keyed by
# version, and prints the two binaries' paths. Skips the build of a binary
# that is already there and reports the pinned version.
#
# Binaries: $RELAYD_PROMETHEUS, else <repo>/.cache/prometheus/<version>/prometheus,
# and $RELAYD_PROMTOOL, else <repo>/.cache/prometheus/<version>/promtool
# (git-ignored). test/observability runs them: promtool checks and
# unit-tests the alert rules, prometheus scrapes a real relayd.
#
# What is left out, because the tests use neither: the web UI's assets (no
# builtinassets tag: the UI pages answer "not found", the HTTP API works) and
# every service discovery but static, file and http (remove_all_sd: the
# tests' scrape config is a static one; promtool keeps its kubernetes
# import). The version is stamped as Prometheus's release builds do it.
# Cold (empty GOCACHE and GOMODCACHE): see the prometheus-bin target in the
# Makefile.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/tools/prometheus
# The version is the one go.mod pins; bump it there (go get -tool ...@vX).
# Prometheus 3.x's Go module versions are v0.3MM.P for release 3.MM.P.
MODULE_VERSION=$(cd "$mod" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
if [[ ! "$MODULE_VERSION" =~ ^v0\.([1-9])([0-9][0-9])\.([0-9]+)$ ]]; then
  echo "prometheus-bin: cannot map module version $MODULE_VERSION to a Prometheus release" >&2
  exit 1
fi
PROMETHEUS_VERSION=${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}
dir=$root/.cache/prometheus/$MODULE_VERSION
prometheus=${RELAYD_PROMETHEUS:-$dir/prometheus}
promtool=${RELAYD_PROMTOOL:-$dir/promtool}

# Capture the output before matching: with pipefail, `cmd | grep -q` fails at
# random when grep exits early and cmd dies of SIGPIPE.
version_of() { [ -x "$1" ] && "$1" --version 2>&1 | head -n 1 || true; }
has_version() { [[ "$(version_of "$1")" == "$2, version $PROMETHEUS_VERSION "* ]]; }

build() { # name, output path
  echo "prometheus-bin: building $1 $PROMETHEUS_VERSION ($MODULE_VERSION) into $2" >&2
  mkdir -p "$(dirname "$2")"
  (cd "$mod" && GOGC=400 CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false \
    -tags netgo,remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
    -o "$2.tmp" "github.com/prometheus/prometheus/cmd/$1")
  mv "$2.tmp" "$2"
}

has_version "$prometheus" prometheus || build prometheus "$prometheus"
has_version "$promtool" promtool || build promtool "$promtool"
for b in prometheus promtool; do
  has_version "${!b}" "$b" || { echo "prometheus-bin: ${!b} does not report $PROMETHEUS_VERSION (got: $(version_of "${!b}"))" >&2; exit 1; }
  echo "${!b}"
done
