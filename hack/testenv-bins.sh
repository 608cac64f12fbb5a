#!/usr/bin/env bash
# Builds the integration-test servers (etcd, kube-apiserver) from the tools/
# module into a cache folder keyed by version, and prints that folder.
# Skips the build when the binaries are already there with the right version.
#
# Cache folder: $RELAYD_TESTENV_BIN, else <repo>/.cache/testenv/k8s-<v>-etcd-<v>
# (git-ignored, so a warm CI run on the same machine reuses it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=v1.37.1
ETCD_VERSION=v3.7.0
dir=${RELAYD_TESTENV_BIN:-$root/.cache/testenv/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}
mkdir -p "$dir"

# Capture --version output before matching: with pipefail, `cmd | grep -q`
# fails at random when grep exits early and cmd dies of SIGPIPE.
version_of() { [ -x "$1" ] && "$1" --version 2>/dev/null || true; }
have_apiserver() { [[ "$(version_of "$dir/kube-apiserver")" == "Kubernetes $K8S_VERSION" ]]; }
have_etcd() { [[ "$(version_of "$dir/etcd")" == *"etcd Version: ${ETCD_VERSION#v}"* ]]; }

cd "$root/tools"
if ! have_etcd; then
  echo "testenv-bins: building etcd $ETCD_VERSION into $dir" >&2
  go build -trimpath -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$dir/etcd.tmp" "$dir/etcd"
fi
if ! have_apiserver; then
  echo "testenv-bins: building kube-apiserver $K8S_VERSION into $dir (cold: 6-12 min on 2 cores)" >&2
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  go build -trimpath -ldflags "-s -w \
    -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 \
    -X k8s.io/component-base/version.gitMinor=$minor" \
    -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
fi
have_etcd || { echo "testenv-bins: $dir/etcd does not report $ETCD_VERSION" >&2; exit 1; }
have_apiserver || { echo "testenv-bins: $dir/kube-apiserver does not report $K8S_VERSION" >&2; exit 1; }
echo "$dir"
