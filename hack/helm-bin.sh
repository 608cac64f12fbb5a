#!/usr/bin/env bash
# Builds helm from the tools/helm module (a build-only module of its own, so
# helm's dependencies never move a version that the other tool builds
# depend on) into a cache folder keyed by version, and prints the binary's
# path. Skips the build when the binary is already there and reports the
# pinned version.
#
# Binary: $RELAYD_HELM, else <repo>/.cache/helm/<version>/helm
# (git-ignored). test/deploy lints and renders deploy/helm/relayd with it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/tools/helm
# The version is the one go.mod pins; bump it there (go get -tool ...@vX).
HELM_VERSION=$(cd "$mod" && go list -m -f '{{.Version}}' helm.sh/helm/v3)
bin=${RELAYD_HELM:-$root/.cache/helm/$HELM_VERSION/helm}

# Capture the output before matching: with pipefail, `cmd | grep -q` fails at
# random when grep exits early and cmd dies of SIGPIPE.
version_of() { [ -x "$1" ] && "$1" version --template '{{.Version}}' 2>/dev/null || true; }
have_helm() { [[ "$(version_of "$bin")" == "$HELM_VERSION" ]]; }

if ! have_helm; then
  echo "helm-bin: building helm $HELM_VERSION into $bin (cold: about 1 min on 2 cores)" >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$mod" && GOGC=400 CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$bin.tmp" helm.sh/helm/v3/cmd/helm)
  mv "$bin.tmp" "$bin"
fi
have_helm || { echo "helm-bin: $bin does not report $HELM_VERSION (got: $(version_of "$bin"))" >&2; exit 1; }
echo "$bin"
