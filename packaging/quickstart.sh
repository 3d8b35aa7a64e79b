#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Quick start on Debian 12 (as root): installs the packages, builds etcfs,
# starts a local one-member etcd of its own (free port, data in /dev/shm, so
# it is a throwaway that a reboot clears) and checks it with
# `etcfsctl etcd-check`.
#
#   packaging/quickstart.sh          start (or report the running one)
#   packaging/quickstart.sh stop     stop the etcd it started, by PID
#
# It never touches an etcd you already run. State: /run/etcfs-quickstart.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
state=${ETCFS_QUICKSTART_STATE:-/run/etcfs-quickstart}
harness=build/test/harness/etcd-harness

if [ "${1:-start}" = stop ]; then
	if [ -x "$harness" ] && [ -d "$state" ]; then
		"$harness" stop --state "$state"
		echo "etcfs quick start: etcd stopped"
	else
		echo "etcfs quick start: nothing to stop"
	fi
	exit 0
fi

packaging/install-deps.sh
[ -d build ] || meson setup build >/dev/null
ninja -C build

if [ -f "$state/env" ] && "$harness" status --state "$state" >/dev/null 2>&1; then
	echo "etcfs quick start: etcd already running"
else
	mkdir -p "$state"
	"$harness" start --state "$state" --fsync --auto-compaction >/dev/null
fi
# shellcheck disable=SC1091
. "$state/env"
echo
echo "etcd for etcfs is listening at $ETCD_ENDPOINTS (data in /dev/shm)."
echo "Checking that it is fit for etcfs:"
build/etcfsd/etcfsctl etcd-check --endpoints "$ETCD_ENDPOINTS" --duration 3
echo
echo "Stop it with: packaging/quickstart.sh stop"
