#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# The `siwx` command and SIWX_TRACE against unmodified applications under
# siwx-run, on loopback and an ephemeral port.
#
# Usage: siwx_tool_test.sh <siwx-run> <siwx> <case>
#   stat           `siwx stat PID` of a running ib_write_bw -R client shows its
#                  QPs in RTS with the negotiated MPA dialect and octets moving
#   trace [crc]    rping under SIWX_TRACE; tshark decodes each process's file
#                  as iWARP: MPA Request and Reply, Send, Write, Read Request
#                  and Response, nothing malformed, no expert error; with
#                  `crc`, CRC and markers required and every CRC good
# Exit status: 0 pass, 1 fail, 77 skipped (no tshark).
set -u
run=$1
siwx=$2
what=$3
variant=${4:-}
: "${SIWX_APPS_TIMEOUT:=60}"
work=$(mktemp -d)
pids=()

cleanup() {
	local p
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	rm -rf "$work"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*" >&2
	local f
	for f in "$work"/*.log; do
		[ -e "$f" ] || continue
		echo "--- $f:" >&2
		cat "$f" >&2
	done
	exit 1
}

pick_port() {
	python3 -c 'import socket
s = socket.socket()
s.bind(("", 0))
print(s.getsockname()[1])'
}

wait_listening() {
	local i
	for i in $(seq 100); do
		ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
		sleep 0.1
	done
	return 1
}

port=$(pick_port)
case $what in
stat)
	timeout -k 5 "$SIWX_APPS_TIMEOUT" "$run" -- ib_write_bw -R -d siwx_lo -p "$port" -D 8 \
		>"$work/server.log" 2>&1 &
	pids+=($!)
	wait_listening "$port" || fail "ib_write_bw server never listened on port $port"
	timeout -k 5 "$SIWX_APPS_TIMEOUT" "$run" -- ib_write_bw -R -d siwx_lo -p "$port" -D 8 \
		127.0.0.1 >"$work/client.log" 2>&1 &
	client=$!
	pids+=("$client")
	# timeout's child execs siwx-run, which execs ib_write_bw: that pid.
	app=""
	for _ in $(seq 50); do
		app=$(pgrep -P "$client" | head -1)
		[ -n "$app" ] && [ "$(cat "/proc/$app/comm" 2>/dev/null)" = ib_write_bw ] && break
		app=""
		sleep 0.1
	done
	[ -n "$app" ] || fail "no ib_write_bw client process under pid $client"
	# Poll until the data QP has moved octets (the test connection comes first).
	ok=""
	for _ in $(seq 100); do
		"$siwx" stat "$app" >"$work/stat.out" 2>"$work/stat.err" || true
		if grep -q "^process $app (ib_write_bw): " "$work/stat.out" &&
			awk -v port="$port" '
				/^  QP [0-9]+: state RTS, local 127\.0\.0\.1:[0-9]+, peer 127\.0\.0\.1:/ {
					qp = ($0 ~ ("peer 127.0.0.1:" port "$")) }
				qp && /^    mpa: MPA v2 \(RFC 6581\), Rev 2,/ { mpa = 1 }
				qp && mpa && /^    tx: [1-9][0-9]* FPDUs, [1-9][0-9]* octets/ { found = 1 }
				END { exit !found }' "$work/stat.out"; then
			ok=1
			break
		fi
		sleep 0.1
	done
	cp "$work/stat.out" "$work/stat.log"
	[ -n "$ok" ] ||
		fail "siwx stat $app never showed an RTS QP to port $port with MPA v2 and octets sent"
	grep -q "^    tcp: [0-9]* retransmits" "$work/stat.out" ||
		fail "siwx stat shows no TCP retransmit count"
	grep -q "^    completions: 0 errors" "$work/stat.out" || fail "completion errors reported"
	grep -q "^    terminate sent: none" "$work/stat.out" || fail "a Terminate reported"
	cat "$work/stat.out"
	# The whole-machine listing shows both ends; a bad pid is a clear error.
	"$siwx" stat >"$work/all.out" || fail "siwx stat failed"
	n=$(grep -c '^process [0-9]* (ib_write_bw)' "$work/all.out")
	[ "$n" -ge 2 ] ||
		fail "siwx stat does not list both ib_write_bw processes"
	if "$siwx" stat 999999999 >/dev/null 2>"$work/bad.err"; then
		fail "siwx stat of a nonexistent process succeeded"
	fi
	wait "$client" || fail "ib_write_bw client failed"
	;;
trace)
	command -v tshark >/dev/null || { echo "SKIP: tshark is not installed"; exit 77; }
	env=(SIWX_TRACE="$work/trace-%p.pcapng")
	if [ "$variant" = crc ]; then
		env+=(SIWX_MPA_CRC=require SIWX_MPA_MARKERS=require)
	fi
	env "${env[@]}" timeout -k 5 "$SIWX_APPS_TIMEOUT" "$run" -- rping -s -a 127.0.0.1 -p "$port" \
		-C 20 -S 3000 >"$work/server.log" 2>&1 &
	server=$!
	pids+=("$server")
	wait_listening "$port" || fail "rping server never listened on port $port"
	env "${env[@]}" timeout -k 5 "$SIWX_APPS_TIMEOUT" "$run" -- rping -c -a 127.0.0.1 -p "$port" \
		-C 20 -S 3000 >"$work/client.log" 2>&1 || fail "rping client failed"
	wait "$server" || fail "rping server failed"
	pids=()
	files=("$work"/trace-*.pcapng)
	[ ${#files[@]} -eq 2 ] && [ -s "${files[0]}" ] ||
		fail "expected two trace files, got: ${files[*]}"
	for f in "${files[@]}"; do
		tshark -r "$f" >"$work/decode.txt" 2>"$work/tshark.err" || fail "tshark cannot read $f"
		echo "$(basename "$f"): $(wc -l <"$work/decode.txt") packets"
		n=$(tshark -r "$f" -Y iwarp_mpa.req 2>/dev/null | wc -l)
		[ "$n" -eq 1 ] || fail "$f: $n MPA Requests, expected one"
		n=$(tshark -r "$f" -Y iwarp_mpa.rep 2>/dev/null | wc -l)
		[ "$n" -eq 1 ] || fail "$f: $n MPA Replies, expected one"
		# RDMAP opcodes (RFC 5040 4.3): 0 Write, 1 Read Request, 2 Read Response, 3 Send.
		ops=$(tshark -r "$f" -T fields -e iwarp_rdma.opcode 2>/dev/null | sort -u | tr '\n' ' ')
		for op in 0x00 0x01 0x02 0x03; do
			case " $ops" in *" $op "*) ;; *) fail "$f: no RDMAP opcode $op (seen: $ops)" ;; esac
		done
		# Each of rping's 20 rounds is 7 messages of one FPDU each (Send, Read
		# Request, Read Response, Send, Send, Write, Send): all decoded.
		fpdus=$(tshark -r "$f" -Y iwarp_rdma 2>/dev/null | wc -l)
		[ "$fpdus" -ge 140 ] || fail "$f: only $fpdus FPDUs decoded as DDP/RDMAP"
		[ -z "$(tshark -r "$f" -Y _ws.malformed 2>/dev/null)" ] || fail "$f: malformed packets"
		tshark -r "$f" -q -z expert,error >"$work/expert.txt" 2>/dev/null
		! grep -q "Errors" "$work/expert.txt" || fail "$f: expert errors: $(cat "$work/expert.txt")"
		if [ "$variant" = crc ]; then
			good=$(tshark -r "$f" -V 2>/dev/null | grep -c 'Good CRC32')
			bad=$(tshark -r "$f" -V 2>/dev/null | grep -c 'Bad CRC32')
			[ "$good" -ge 140 ] && [ "$bad" -eq 0 ] || fail "$f: $good good and $bad bad CRCs"
			tshark -r "$f" -V 2>/dev/null | grep -q 'FPDU back pointer' || fail "$f: no markers decoded"
		fi
		tshark -r "$f" -q -z expert 2>/dev/null | sed -n '/Warns/,$p'
	done
	;;
*)
	echo "unknown case '$what'" >&2
	exit 2
	;;
esac
echo "PASS: $what $variant"
