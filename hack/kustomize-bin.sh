#!/usr/bin/env bash
# Builds kustomize from the tools/kustomize module (a build-only module of its
# own, so kustomize's dependencies never move a version that the
# kube-apiserver build in tools/ depends on) into a cache folder keyed by
# version, and prints the binary's path. Skips the build when the binary is
# already there and reports the pinned version.
#
# Binary: $RELAYD_KUSTOMIZE, else <repo>/.cache/kustomize/<version>/kustomize
# (git-ignored). test/deploy renders deploy/ with it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/tools/kustomize
# The version is the one go.mod pins; bump it there (go get -tool ...@vX).
KUSTOMIZE_VERSION=$(cd "$mod" && go list -m -f '{{.Version}}' sigs.k8s.io/kustomize/kustomize/v5)
bin=${RELAYD_KUSTOMIZE:-$root/.cache/kustomize/$KUSTOMIZE_VERSION/kustomize}

# Capture the output before matching: with pipefail, `cmd | grep -q` fails at
# random when grep exits early and cmd dies of SIGPIPE.
version_of() { [ -x "$1" ] && "$1" version 2>/dev/null || true; }
have_kustomize() { [[ "$(version_of "$bin")" == "$KUSTOMIZE_VERSION" ]]; }

if ! have_kustomize; then
  echo "kustomize-bin: building kustomize $KUSTOMIZE_VERSION into $bin (cold: about 1 min on 2 cores)" >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$mod" && GOGC=400 CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$bin.tmp" sigs.k8s.io/kustomize/kustomize/v5)
  mv "$bin.tmp" "$bin"
fi
have_kustomize || { echo "kustomize-bin: $bin does not report $KUSTOMIZE_VERSION (got: $(version_of "$bin"))" >&2; exit 1; }
echo "$bin"
