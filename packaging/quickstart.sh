#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# Quick start on Debian 12 (as root): installs the packages, builds etcfs,
# starts a local one-member etcd of its own (free port, data in /dev/shm, so
# it is a throwaway that a reboot clears), checks it with
# `etcfsctl etcd-check`, makes a sparse 4 GiB image file, formats it with
# mkfs.etcfs and mounts it with etcfsd.
#
#   packaging/quickstart.sh [start] [MOUNTPOINT]   start (default /mnt/etcfs),
#                                                  or report the running one
#   packaging/quickstart.sh node N [MOUNTPOINT]    another node (N = 2..9) of
#                                                  the same filesystem on this
#                                                  machine: node id <host>-N,
#                                                  mounted at /mnt/etcfsN (default),
#                                                  over the same image and etcd
#   packaging/quickstart.sh stop                   unmount every node, stop the
#                                                  etcd it started; nothing keeps
#                                                  running
#
# It never touches an etcd you already run. State: /run/etcfs-quickstart;
# the image: /var/lib/etcfs-quickstart/disk.img (kept by stop; delete it to
# free the space). ETCFS_QUICKSTART_STATE, ETCFS_QUICKSTART_IMAGE,
# ETCFS_QUICKSTART_SIZE and ETCFS_QUICKSTART_BUILD (the build directory,
# default build) override those.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
state=${ETCFS_QUICKSTART_STATE:-/run/etcfs-quickstart}
image=${ETCFS_QUICKSTART_IMAGE:-/var/lib/etcfs-quickstart/disk.img}
size=${ETCFS_QUICKSTART_SIZE:-4G}
build=${ETCFS_QUICKSTART_BUILD:-build}
harness=$build/test/harness/etcd-harness
fsname=quickstart

cmd=start
if [ $# -gt 0 ] && { [ "$1" = start ] || [ "$1" = stop ] || [ "$1" = node ]; }; then
	cmd=$1
	shift
fi

is_mounted() {
	grep -q " $1 fuse.etcfs " /proc/self/mounts 2>/dev/null
}

# Waits (bounded) for the daemon whose PID the start recorded.
wait_daemon() {
	local pid
	pid=$(cat "$state/etcfsd.pid" 2>/dev/null || true)
	[ -n "$pid" ] || return 0
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || { rm -f "$state/etcfsd.pid"; return 0; }
		sleep 0.1
	done
	echo "etcfs quick start: etcfsd (pid $pid) did not exit; stopping it" >&2
	kill -TERM "$pid" 2>/dev/null || true
	rm -f "$state/etcfsd.pid"
}

# Unmounts the extra node whose state is in directory $1 (bounded wait).
stop_node() {
	local dir=$1 mnt pid
	mnt=$(cat "$dir/mountpoint" 2>/dev/null || true)
	pid=$(cat "$dir/etcfsd.pid" 2>/dev/null || true)
	if [ -n "$mnt" ] && is_mounted "$mnt"; then
		umount "$mnt"
		echo "etcfs quick start: unmounted $mnt ($(basename "$dir"))"
	fi
	if [ -n "$pid" ]; then
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -TERM "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
}

if [ "$cmd" = stop ]; then
	did=
	for dir in "$state"/node*; do
		[ -d "$dir" ] || continue
		stop_node "$dir"
		did=1
	done
	mnt=$(cat "$state/mountpoint" 2>/dev/null || true)
	if [ -n "$mnt" ] && is_mounted "$mnt"; then
		# etcfsd leaves cleanly on umount: locks released, lease revoked.
		umount "$mnt"
		wait_daemon
		echo "etcfs quick start: unmounted $mnt"
		did=1
	fi
	rm -f "$state/mountpoint"
	if [ -x "$harness" ] && [ -f "$state/state" ]; then
		"$harness" stop --state "$state"
		rm -f "$state/formatted"
		echo "etcfs quick start: etcd stopped"
		did=1
	fi
	[ -n "$did" ] || echo "etcfs quick start: nothing to stop"
	[ -f "$image" ] && echo "The image $image is kept; remove it to free its space."
	exit 0
fi

if [ "$cmd" = node ]; then
	n=${1:-}
	case $n in
	[2-9]) ;;
	*)
		echo "usage: packaging/quickstart.sh node N [MOUNTPOINT]   (N from 2 to 9)" >&2
		exit 2
		;;
	esac
	old=$(cat "$state/mountpoint" 2>/dev/null || true)
	if [ -z "$old" ] || ! is_mounted "$old" || [ ! -f "$state/env" ]; then
		echo "etcfs quick start: the first node is not running; run packaging/quickstart.sh first" >&2
		exit 1
	fi
	# shellcheck disable=SC1091
	. "$state/env"
	dir=$state/node$n
	mnt=${2:-/mnt/etcfs$n}
	case $mnt in
	/*) ;;
	*) mnt=$PWD/$mnt ;;
	esac
	node_id="$(hostname -s | tr -c 'A-Za-z0-9._\n-' _)-$n"
	if [ -f "$dir/mountpoint" ] && is_mounted "$(cat "$dir/mountpoint")"; then
		echo "etcfs quick start: node $n already mounted at $(cat "$dir/mountpoint")"
		exit 0
	fi
	mkdir -p "$dir" "$mnt"
	log=$dir/etcfsd.log
	: >"$log"
	"$build"/etcfsd/etcfsd --endpoints "$ETCD_ENDPOINTS" --node-id "$node_id" \
		--metrics-addr 127.0.0.1:0 --log-file "$log" "$image" "$mnt"
	echo "$mnt" >"$dir/mountpoint"
	sed -n 's/.*mounted .* (pid \([0-9]*\)).*/\1/p' "$log" | tail -1 >"$dir/etcfsd.pid"
	echo "etcfs node $node_id is mounted at $mnt: the same filesystem as $old"
	echo "  log:     $log"
	echo "Stop every node with: packaging/quickstart.sh stop"
	exit 0
fi

mnt=${1:-/mnt/etcfs}
case $mnt in
/*) ;;
*) mnt=$PWD/$mnt ;;
esac

packaging/install-deps.sh
[ -d "$build" ] || meson setup "$build" >/dev/null
ninja -C "$build"

fresh=
if [ -f "$state/env" ] && "$harness" status --state "$state" >/dev/null 2>&1; then
	echo "etcfs quick start: etcd already running"
else
	mkdir -p "$state"
	"$harness" start --state "$state" --fsync --auto-compaction >/dev/null
	fresh=1
fi
# shellcheck disable=SC1091
. "$state/env"
echo
echo "etcd for etcfs is listening at $ETCD_ENDPOINTS (data in /dev/shm)."
echo "Checking that it is fit for etcfs:"
"$build"/etcfsd/etcfsctl etcd-check --endpoints "$ETCD_ENDPOINTS" --duration 3
echo

old=$(cat "$state/mountpoint" 2>/dev/null || true)
if [ -n "$old" ] && is_mounted "$old"; then
	echo "etcfs quick start: already mounted at $old"
	mnt=$old
else
	# A new etcd has an empty keyspace: (re)format the quick start's own
	# image for it (--force: an image left from an earlier run names a
	# keyspace that is gone).
	if [ -n "$fresh" ] || [ ! -f "$state/formatted" ]; then
		mkdir -p "$(dirname "$image")"
		[ -f "$image" ] || truncate -s "$size" "$image"
		"$build"/etcfsd/mkfs.etcfs --endpoints "$ETCD_ENDPOINTS" --name "$fsname" --force \
			"$image"
		touch "$state/formatted"
	fi
	mkdir -p "$mnt"
	log=$state/etcfsd.log
	: >"$log"
	# Returns once the mount answers; the daemon keeps serving in the background.
	"$build"/etcfsd/etcfsd --endpoints "$ETCD_ENDPOINTS" --metrics-addr 127.0.0.1:0 \
		--log-file "$log" "$image" "$mnt"
	echo "$mnt" >"$state/mountpoint"
	sed -n 's/.*mounted .* (pid \([0-9]*\)).*/\1/p' "$log" | tail -1 >"$state/etcfsd.pid"
fi

metrics=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$state/etcfsd.log" 2>/dev/null |
	tail -1)
echo
echo "etcfs is mounted at $mnt"
echo "  device:  $image (sparse, $(du -h "$image" | cut -f1) used)"
echo "  etcd:    $ETCD_ENDPOINTS"
[ -n "$metrics" ] && echo "  metrics: $metrics"
echo "  log:     $state/etcfsd.log"
echo
echo "Stop everything with: packaging/quickstart.sh stop"
