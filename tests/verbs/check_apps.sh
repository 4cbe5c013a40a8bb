#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Runs unmodified rdma-core tools under siwx-run and checks what they print,
# and checks siwx-run's own behaviour (help, exit status, LD_PRELOAD, errors).
# Usage: check_apps.sh <siwx-run> <ibv_devices|ibv_devinfo|launcher>
set -u
run=$1
what=$2
failures=0

fail() {
	echo "FAIL: $*" >&2
	failures=$((failures + 1))
}

# expect_in <file> <fixed string> <description>
expect_in() {
	grep -F -q -- "$2" "$1" || fail "$3: '$2' not found in output:" "$(cat "$1")"
}

out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

# Interfaces with an IPv4/IPv6 address (the ones that get a siwx device).
interfaces=$(ip -o addr show 2>/dev/null | awk '{print $2}' | sed 's/@.*//' | sort -u)
[ -n "$interfaces" ] || interfaces=lo
tab=$(printf '\t')

case $what in
ibv_devices)
	"$run" ibv_devices >"$out" 2>"$err" || fail "ibv_devices exited with $?: $(cat "$err")"
	expect_in "$out" "device" "ibv_devices header"
	for ifname in $interfaces; do
		expect_in "$out" "siwx_$ifname" "device of interface $ifname"
	done
	# siwx_lo's node GUID is "siwx_l" in ASCII.
	grep -q "siwx_lo[[:space:]]*736977785f6c0000" "$out" || fail "siwx_lo GUID: $(cat "$out")"
	;;
ibv_devinfo)
	"$run" ibv_devinfo -v >"$out" 2>"$err" || fail "ibv_devinfo -v exited with $?: $(cat "$err")"
	for ifname in $interfaces; do
		expect_in "$out" "hca_id:${tab}siwx_$ifname" "device of interface $ifname"
	done
	expect_in "$out" "transport:${tab}${tab}${tab}iWARP (1)" "transport"
	expect_in "$out" "state:${tab}${tab}${tab}PORT_ACTIVE (4)" "port state"
	expect_in "$out" "link_layer:${tab}${tab}Ethernet" "link layer"
	expect_in "$out" "max_qp_wr:${tab}${tab}${tab}1048576" "limits"
	expect_in "$out" "max_sge:${tab}${tab}${tab}16" "limits"
	expect_in "$out" "max_cqe:${tab}${tab}${tab}1048576" "limits"
	expect_in "$out" "max_srq_wr:${tab}${tab}${tab}1048576" "limits"
	expect_in "$out" "max_qp_rd_atom:${tab}${tab}${tab}128" "limits"
	expect_in "$out" "phys_port_cnt:${tab}${tab}${tab}1" "ports"
	# siwx_lo's GID names this process's out-of-band listener on 127.0.0.1
	# (docs/out-of-band-connect.md): prefix zero, a port, ffff, the address.
	grep -Eq "GID\[  0\]:${tab}${tab}0000:0000:0000:0000:[0-9a-f]{4}:ffff:7f00:0001, RoCE v1" "$out" ||
		fail "siwx_lo GID does not name 127.0.0.1 and a port:" "$(grep 'GID' "$out")"
	! grep -q "GID\[  0\]:${tab}${tab}0000:0000:0000:0000:0000:ffff:" "$out" ||
		fail "a GID with port 0:" "$(grep 'GID' "$out")"
	# Every device shows exactly one GID.
	devices=$(grep -c '^hca_id:' "$out")
	gids=$(grep -c 'GID\[  0\]' "$out")
	[ "$devices" = "$gids" ] || fail "$devices devices but $gids GIDs"
	# Each device can be selected by name.
	for ifname in $interfaces; do
		"$run" ibv_devinfo -d "siwx_$ifname" >"$out" 2>"$err" ||
			fail "ibv_devinfo -d siwx_$ifname exited with $?: $(cat "$err")"
		expect_in "$out" "hca_id:${tab}siwx_$ifname" "ibv_devinfo -d siwx_$ifname"
		expect_in "$out" "transport:${tab}${tab}${tab}iWARP (1)" "ibv_devinfo -d siwx_$ifname"
	done
	"$run" ibv_devinfo -d siwx_no_such_device >"$out" 2>&1 && fail "unknown device accepted"
	;;
launcher)
	"$run" --help >"$out" 2>&1 || fail "--help exited with $?"
	expect_in "$out" "Usage: siwx-run" "--help"
	"$run" sh -c 'exit 7'
	rc=$?
	[ "$rc" = 7 ] || fail "exit status not passed through: $rc"
	"$run" -- sh -c 'kill -TERM $$'
	rc=$?
	[ "$rc" = 143 ] || fail "signal status not passed through: $rc"
	"$run" >"$out" 2>&1
	rc=$?
	[ "$rc" = 125 ] || fail "no program: exit $rc"
	expect_in "$out" "no program given" "no program"
	"$run" --bogus true >"$out" 2>&1
	[ $? = 125 ] || fail "unknown option accepted"
	expect_in "$out" "unknown option '--bogus'" "unknown option"
	"$run" siwx-no-such-program >"$out" 2>&1
	rc=$?
	[ "$rc" = 127 ] || fail "missing program: exit $rc"
	expect_in "$out" "siwx-no-such-program: command not found" "missing program"
	SIWX_SHIM=/nonexistent/libsiwx-shim.so "$run" true >"$out" 2>&1
	rc=$?
	[ "$rc" = 125 ] || fail "missing shim: exit $rc"
	expect_in "$out" "SIWX_SHIM=/nonexistent/libsiwx-shim.so is not a readable file" "missing shim"
	# An existing LD_PRELOAD is kept, behind the shim and the CM.
	LD_PRELOAD=libm.so.6 "$run" sh -c 'echo "$LD_PRELOAD"' >"$out" 2>"$err"
	grep -q 'libsiwx-shim.so:[^:]*librdmacm-siwx.so:libm.so.6$' "$out" || fail "LD_PRELOAD: $(cat "$out" "$err")"
	# --log-level reaches the library.
	"$run" --log-level info ibv_devices >"$out" 2>"$err" || fail "ibv_devices with --log-level"
	expect_in "$err" "siwx: info: device siwx_lo on interface lo" "--log-level info"
	"$run" --log-level loud true >"$out" 2>&1
	[ $? = 125 ] || fail "bad log level accepted"
	expect_in "$out" "unknown log level 'loud'" "bad log level"
	# Quiet by default.
	"$run" ibv_devices >"$out" 2>"$err" || fail "ibv_devices"
	[ ! -s "$err" ] || fail "stderr not empty by default: $(cat "$err")"
	;;
*)
	echo "usage: $0 <siwx-run> ibv_devices|ibv_devinfo|launcher" >&2
	exit 2
	;;
esac

[ "$failures" = 0 ] || exit 1
echo "$what: ok"
