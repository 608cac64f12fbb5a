#!/usr/bin/env bash
# Installs Debian's prometheus package (prometheus + promtool, for
# test/observability) if they are missing, without ever starting its service
# (`make prometheus-bin`; tests run their own prometheus).
#
# The package's postinst runs `invoke-rc.d prometheus start` (and, under
# systemd, deb-systemd-invoke start). Both ask policy-rc.d, and exit 101
# forbids the start: a placeholder that says so is put in place for the
# install, and whatever was there before is put back afterwards — also when
# the script is interrupted (INT, TERM, HUP: apt is stopped first, then the
# original is restored) and even after a SIGKILL: the original is saved next
# to it as <policy>.relayd-saved before the placeholder goes in, and every run
# starts by putting back a placeholder it finds (recognised by its marker
# line) from that copy, or removing it when there was none. Under systemd
# the unit the package enables is also disabled and stopped.
#
# Environment (for tests): RELAYD_POLICY_RC_D, the policy file (default
# /usr/sbin/policy-rc.d).
set -euo pipefail

policy=${RELAYD_POLICY_RC_D:-/usr/sbin/policy-rc.d}
saved=$policy.relayd-saved
marker='# relayd hack/prometheus-bin.sh placeholder: forbids service starts during its apt-get install'

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo

is_placeholder() { [ -f "$policy" ] && grep -qxF "$marker" "$policy"; }

# restore puts the original policy back (or removes the placeholder when
# there was none). Each step leaves a state the next run can finish: the
# copy is moved into place atomically, and a saved copy next to a policy
# that is not the placeholder is stale.
restore() {
	if is_placeholder; then
		if [ -e "$saved" ]; then
			$sudo cp -p "$saved" "$policy.relayd-tmp"
			$sudo mv -f "$policy.relayd-tmp" "$policy"
		else
			$sudo rm -f "$policy"
		fi
	fi
	$sudo rm -f "$saved" "$saved.part" "$policy.relayd-tmp"
}

# A run killed with SIGKILL left its placeholder: put the original back
# before anything else (also when prometheus got installed meanwhile).
if is_placeholder || [ -e "$saved" ]; then
	echo "prometheus-bin: restoring $policy left behind by an interrupted run"
	restore
fi

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then exit 0; fi
echo "installing Debian's prometheus package (prometheus, promtool)"

child=""
on_signal() {
	trap '' INT TERM HUP
	if [ -n "$child" ]; then
		kill -TERM "$child" 2>/dev/null || true
		wait "$child" 2>/dev/null || true
	fi
	restore
	trap - EXIT
	echo "prometheus-bin: interrupted by SIG$1; $policy restored" >&2
	exit $((128 + $2))
}
trap restore EXIT
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM
trap 'on_signal HUP 1' HUP

# run runs a command in the background and waits for it, so that a signal
# is handled at once (bash runs traps only between commands, and wait is
# one) and can stop the command before the policy is restored.
run() {
	"$@" &
	child=$!
	local rc=0
	wait "$child" || rc=$?
	child=""
	return "$rc"
}

# Save the original first (a copy next to it, on the same file system),
# then replace it atomically: at every moment the policy is the original or
# the placeholder, and the placeholder always has the original's copy (or
# there was none).
$sudo rm -f "$saved"
if [ -e "$policy" ]; then
	$sudo cp -p "$policy" "$saved.part"
	$sudo mv -f "$saved.part" "$saved"
fi
printf '#!/bin/sh\n%s\nexit 101\n' "$marker" | $sudo tee "$policy.relayd-tmp" >/dev/null
$sudo chmod 755 "$policy.relayd-tmp"
$sudo mv -f "$policy.relayd-tmp" "$policy"

run $sudo apt-get update
run $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus
if [ -d /run/systemd/system ]; then run $sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true; fi
restore
trap - EXIT INT TERM HUP
prometheus --version 2>&1 | head -1
promtool --version 2>&1 | head -1
