#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages etcfs needs to build, test and run, when
# they are missing. Needs root to install; otherwise it only lists what is
# missing and fails. Used by packaging/quickstart.sh and test/run.
set -euo pipefail

pkgs=(meson ninja-build pkg-config gcc clang libclang-rt-14-dev
      libuv1-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler
      libssl-dev openssl libfuse3-dev fuse3 libcriterion-dev
      etcd-server etcd-client procps iproute2 util-linux
      debhelper dpkg-dev fakeroot lintian rpm systemd man-db prometheus)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "etcfs: missing packages: ${missing[*]}; run as root or install them" >&2
	exit 1
fi
echo "etcfs: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
