#!/usr/bin/env bash
# Builds nats-server from the module the root go.mod requires
# (github.com/nats-io/nats-server/v2, the version the embedded test servers
# link) into a cache folder keyed by version, and prints the binary's path.
# internal/testenv runs the JetStream cluster of the chaos scenarios
# (StartNATSCluster) as child processes of this binary, so that a member
# can be killed with SIGKILL. Skips the build when the binary is already
# there and reports the pinned version.
#
# Binary: $RELAYD_NATS_SERVER, else <repo>/.cache/nats-server/<version>/nats-server
# (git-ignored). Cold (empty GOCACHE, modules already downloaded): about
# 50 CPU-seconds, 29 s on an idle 2-core machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The version is the one go.mod pins; bump it there (go get ...@vX).
NATS_SERVER_VERSION=$(cd "$root" && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
bin=${RELAYD_NATS_SERVER:-$root/.cache/nats-server/$NATS_SERVER_VERSION/nats-server}

# Capture the output before matching: with pipefail, `cmd | grep -q` fails at
# random when grep exits early and cmd dies of SIGPIPE.
version_of() { [ -x "$1" ] && "$1" --version 2>/dev/null || true; }
have_nats_server() { [[ "$(version_of "$bin")" == "nats-server: $NATS_SERVER_VERSION" ]]; }

if ! have_nats_server; then
  echo "nats-server-bin: building nats-server $NATS_SERVER_VERSION into $bin (cold: about 30 s on 2 cores)" >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$root" && GOGC=400 CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false \
    -ldflags "-s -w" -o "$bin.tmp" github.com/nats-io/nats-server/v2)
  mv "$bin.tmp" "$bin"
fi
have_nats_server || { echo "nats-server-bin: $bin does not report $NATS_SERVER_VERSION (got: $(version_of "$bin"))" >&2; exit 1; }
echo "$bin"
