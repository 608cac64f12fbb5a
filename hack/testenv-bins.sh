#!/usr/bin/env bash
# Builds the integration-test servers into cache folders keyed by version,
# and prints those folders (one a line, default version first):
#   etcd and kube-apiserver K8S_VERSION from the tools/ module, and
#   kube-apiserver K8S_PREV_VERSION (the oldest minor still in upstream
#   support when K8S_VERSION was released) from tools/k8s-v1.35/, next to a
#   copy of the same etcd (it runs on it; internal/testenv starts either).
# Skips each build when the binary is already there with the right version.
# With --current-only (make demo, bench, chaos) only K8S_VERSION is built.
#
# Cache folders: $RELAYD_TESTENV_BIN, else <repo>/.cache/testenv/k8s-<v>-etcd-<v>,
# and $RELAYD_TESTENV_BIN_PREV, else the same pattern for K8S_PREV_VERSION
# (git-ignored, so a warm CI run on the same machine reuses them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=v1.37.1
K8S_PREV_VERSION=v1.35.4
ETCD_VERSION=v3.7.0
dir=${RELAYD_TESTENV_BIN:-$root/.cache/testenv/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}
prev_dir=${RELAYD_TESTENV_BIN_PREV:-$root/.cache/testenv/k8s-$K8S_PREV_VERSION-etcd-$ETCD_VERSION}
mkdir -p "$dir" "$prev_dir"

# The servers are built once and never debugged: no DWARF (-dwarf=false
# saves compile time, -s -w only strips it at link), and the compiler's
# garbage collector runs less often (GOGC=400; memory is not the limit).
export GOGC=400
nodwarf=-gcflags=all=-dwarf=false

# Capture --version output before matching: with pipefail, `cmd | grep -q`
# fails at random when grep exits early and cmd dies of SIGPIPE.
version_of() { [ -x "$1" ] && "$1" --version 2>/dev/null || true; }
have_apiserver() { [[ "$(version_of "$1/kube-apiserver")" == "Kubernetes $2" ]]; }
have_etcd() { [[ "$(version_of "$1/etcd")" == *"etcd Version: ${ETCD_VERSION#v}"* ]]; }

# build_apiserver <module dir> <version> <folder>
build_apiserver() {
  local minor=${2#v1.}; minor=${minor%%.*}
  echo "testenv-bins: building kube-apiserver $2 from ${1#"$root"/} into $3 (cold: 3-10 min on 2 cores)" >&2
  (cd "$1" && go build -trimpath "$nodwarf" -ldflags "-s -w \
    -X k8s.io/component-base/version.gitVersion=$2 \
    -X k8s.io/component-base/version.gitMajor=1 \
    -X k8s.io/component-base/version.gitMinor=$minor" \
    -o "$3/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "$3/kube-apiserver.tmp" "$3/kube-apiserver"
}

if ! have_etcd "$dir"; then
  echo "testenv-bins: building etcd $ETCD_VERSION into $dir" >&2
  (cd "$root/tools" && go build -trimpath "$nodwarf" -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$dir/etcd.tmp" "$dir/etcd"
fi
have_apiserver "$dir" "$K8S_VERSION" || build_apiserver "$root/tools" "$K8S_VERSION" "$dir"
if [ "${1:-}" = --current-only ]; then
  have_apiserver "$dir" "$K8S_VERSION" || { echo "testenv-bins: $dir/kube-apiserver does not report $K8S_VERSION" >&2; exit 1; }
  echo "$dir"
  exit 0
fi
if ! have_etcd "$prev_dir"; then
  cp "$dir/etcd" "$prev_dir/etcd.tmp"
  mv "$prev_dir/etcd.tmp" "$prev_dir/etcd"
fi
have_apiserver "$prev_dir" "$K8S_PREV_VERSION" || build_apiserver "$root/tools/k8s-v1.35" "$K8S_PREV_VERSION" "$prev_dir"

for d in "$dir:$K8S_VERSION" "$prev_dir:$K8S_PREV_VERSION"; do
  have_etcd "${d%:*}" || { echo "testenv-bins: ${d%:*}/etcd does not report $ETCD_VERSION" >&2; exit 1; }
  have_apiserver "${d%:*}" "${d##*:}" || { echo "testenv-bins: ${d%:*}/kube-apiserver does not report ${d##*:}" >&2; exit 1; }
done
echo "$dir"
echo "$prev_dir"
