#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Runs port_events in a private user and network namespace with a veth pair
# v0 (198.51.100.1/24, a documentation range; nothing is sent to it) / v1 and
# a spare veth v2 / v3, all but v0 without any address.
# Exit 77 (CTest: skipped) when the host does not allow such a namespace.
# Usage: check_port_events.sh <siwx-run> <port_events program>
set -u
run=$1
program=$2
if ! command -v unshare >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
	echo "SKIP: needs unshare(1) and ip(8)" >&2
	exit 77
fi
if ! unshare -rn sh -c 'ip link add t0 type veth peer name t1' >/dev/null 2>&1; then
	echo "SKIP: this host allows no user+network namespace with veth links" >&2
	exit 77
fi
exec unshare -rn sh -c '
	set -e
	ip link set lo up
	ip link add v0 type veth peer name v1
	ip link add v2 type veth peer name v3
	# No IPv6 link-local addresses on the others: they must stay address-less.
	for link in v1 v2 v3; do ip link set "$link" addrgenmode none; done
	ip addr add 198.51.100.1/24 dev v0
	ip link set v0 up
	ip link set v1 up
	ip link set v3 up
	exec "$0" -- "$1"' "$run" "$program"
