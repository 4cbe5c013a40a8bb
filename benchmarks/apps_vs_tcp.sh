#!/usr/bin/env bash
# Unmodified perftest over siwx_lo (under siwx-run, rdma_cm -R) next to the
# kernel TCP stack on the same loopback: ib_{write,read,send}_bw at 64 KiB
# against iperf3 (-l 64K), ib_{write,read,send}_lat at 8 B against a TCP
# ping-pong of 8 B (benchmarks/tcp_pingpong.c, busy-poll and blocking).
#
# Every round runs every row once, round-robin, so each siwx figure has its
# TCP reference taken seconds before it; ratios are per round, and the table
# shows the median of those ratios next to medians and min/max of the
# figures. A program that prints figures, not a test.
#
# Usage: benchmarks/apps_vs_tcp.sh [--rounds N] [--crc] [--build DIR]
#   --rounds N   rounds (default 5, at least 1)
#   --crc        SIWX_MPA_CRC=require on both ends (CRC32c on every FPDU)
#   --build DIR  the build tree (default build/release next to this script)
set -u

here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build/release
rounds=5
crc=allow
while [ $# -gt 0 ]; do
	case $1 in
	--rounds) rounds=${2:-}; shift 2 ;;
	--crc) crc=require; shift ;;
	--build) build=${2:-}; shift 2 ;;
	-h | --help) sed -n '2,17p' "$0"; exit 0 ;;
	*) echo "apps_vs_tcp.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
case $rounds in
'' | *[!0-9]* | 0) echo "apps_vs_tcp.sh: --rounds needs a whole number of at least 1" >&2; exit 2 ;;
esac

run=$build/kernel-shim/siwx-run
pingpong=$build/benchmarks/tcp_pingpong
for need in "$run" "$pingpong"; do
	if [ ! -x "$need" ]; then
		echo "apps_vs_tcp.sh: $need is missing; build first (cmake --preset release && ninja -C build/release)" >&2
		exit 1
	fi
done
for tool in iperf3 ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat ss python3; do
	if ! command -v "$tool" >/dev/null; then
		echo "apps_vs_tcp.sh: $tool is not installed (scripts/install-deps.sh installs perftest and iperf3)" >&2
		exit 1
	fi
done

export SIWX_MPA_CRC=$crc
work=$(mktemp -d)
server_pid=""
cleanup() {
	if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
		kill -TERM "$server_pid" 2>/dev/null
		wait "$server_pid" 2>/dev/null
	fi
	rm -rf "$work"
}
trap cleanup EXIT

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
		kill -0 "$server_pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# pair <log prefix> <port> <server command...> ::: <client command...>
# Runs both ends (each under a 60 s timeout); 0 when both exit 0. (":::"
# because siwx-run takes "--".)
pair() {
	local log=$1 port=$2
	shift 2
	local server=() client=()
	while [ $# -gt 0 ] && [ "$1" != ":::" ]; do server+=("$1"); shift; done
	shift
	client=("$@")
	timeout -k 5 60 "${server[@]}" >"$log.server" 2>&1 &
	server_pid=$!
	if ! wait_listening "$port"; then
		echo "  (server did not listen on $port: $(tail -n 2 "$log.server" | tr '\n' ' '))" >&2
		wait "$server_pid" 2>/dev/null
		server_pid=""
		return 1
	fi
	timeout -k 5 60 "${client[@]}" >"$log.client" 2>&1
	local client_rc=$?
	wait "$server_pid"
	local server_rc=$?
	server_pid=""
	[ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ]
}

# The figures of one run go to $work/<row>.values, one line per round:
# "<figure> [<p99>]", or "fail" when the run failed.
record() { echo "$2" >>"$work/$1.values"; }

run_iperf3() {
	local port log=$work/iperf3
	port=$(pick_port)
	if pair "$log" "$port" iperf3 -s -1 -p "$port" ::: \
		iperf3 -c 127.0.0.1 -p "$port" -l 64K -t 3 -f g; then
		# The receiver's summary line: "... <value> Gbits/sec  receiver".
		record iperf3 "$(awk '/receiver/ { for (i = 1; i < NF; ++i) if ($(i + 1) == "Gbits/sec") v = $i } END { print v }' "$log.client")"
	else
		record iperf3 fail
	fi
}

run_perftest_bw() {
	local tool=$1 port log=$work/$1
	port=$(pick_port)
	local args=(-R -d siwx_lo -s 65536 -D 3 --report_gbits -p "$port")
	if pair "$log" "$port" "$run" -- "$tool" "${args[@]}" ::: "$run" -- "$tool" "${args[@]}" 127.0.0.1; then
		# " 65536  <iterations>  <peak>  <average>  <msg rate>": the average.
		record "$tool" "$(awk '$1 == 65536 && NF >= 5 { v = $4 } END { print v }' "$log.client")"
	else
		record "$tool" fail
		echo "  $tool failed in this round: $(tail -n 3 "$log.client" 2>/dev/null | tr '\n' ' ')" >&2
	fi
}

run_perftest_lat() {
	local tool=$1 port log=$work/$1
	port=$(pick_port)
	local args=(-R -d siwx_lo -s 8 -n 5000 -p "$port")
	if pair "$log" "$port" "$run" -- "$tool" "${args[@]}" ::: "$run" -- "$tool" "${args[@]}" 127.0.0.1; then
		# " 8  5000  t_min  t_max  t_typical  t_avg  t_stdev  99%  99.9%".
		record "$tool" "$(awk '$1 == 8 && $2 == 5000 && NF >= 9 { v = $5 " " $8 } END { print v }' "$log.client")"
	else
		record "$tool" fail
		echo "  $tool failed in this round: $(tail -n 3 "$log.client" 2>/dev/null | tr '\n' ' ')" >&2
	fi
}

run_tcp_pingpong() {
	local mode=$1 out
	if out=$("$pingpong" --mode="$mode" --size=8 --iters=5000); then
		record "tcp_$mode" "$(echo "$out" | sed -n 's/.*half_rtt_median_us=\([0-9.]*\) half_rtt_p99_us=\([0-9.]*\).*/\1 \2/p')"
	else
		record "tcp_$mode" fail
	fi
}

cpus=$(nproc)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "apps_vs_tcp: $rounds rounds, SIWX_MPA_CRC=$crc, $cpus CPUs, load average $load_before at start"
for round in $(seq "$rounds"); do
	echo "round $round/$rounds ..." >&2
	run_iperf3
	run_perftest_bw ib_write_bw
	run_perftest_bw ib_read_bw
	run_perftest_bw ib_send_bw
	run_tcp_pingpong busy
	run_tcp_pingpong blocking
	run_perftest_lat ib_write_lat
	run_perftest_lat ib_read_lat
	run_perftest_lat ib_send_lat
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# The table. Ratios pair the rows of the same round; a failed run gives no
# figure and no ratio.
python3 - "$work" "$rounds" <<'EOF'
import statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])

def load(row):
    out = []
    with open(f"{work}/{row}.values") as f:
        for line in f:
            parts = line.split()
            try:
                out.append([float(p) for p in parts] if parts and parts[0] != "fail" else None)
            except ValueError:
                out.append(None)
    return (out + [None] * rounds)[:rounds]

def spread(values):
    v = [x for x in values if x is not None]
    if not v:
        return "failed every round"
    return f"{statistics.median(v):8.2f} {min(v):8.2f} {max(v):8.2f}  ({len(v)}/{rounds} ok)"

def ratios(values, ref):
    r = [a / b for a, b in zip(values, ref) if a is not None and b is not None and b > 0]
    if not r:
        return "-", "-"
    return f"{statistics.median(r):.2f}", " ".join(f"{x:.2f}" for x in r)

iperf = [x[0] if x else None for x in load("iperf3")]
print()
print("Bandwidth, 64 KiB messages, Gb/s          median      min      max")
print(f"  {'iperf3 -l 64K (TCP)':<36}{spread(iperf)}")
for tool in ("ib_write_bw", "ib_read_bw", "ib_send_bw"):
    v = [x[0] if x else None for x in load(tool)]
    med, per_round = ratios(v, iperf)
    print(f"  {tool + ' -R siwx_lo':<36}{spread(v)}")
    print(f"  {'  / iperf3: median of ratios':<36}{med:>8}   per round: {per_round}")

print()
print("Latency, 8 B, microseconds (half round trip, except ib_read_lat: a Read's")
print("full round trip)                          median      min      max")
tcp = {}
for mode in ("busy", "blocking"):
    rows = load(f"tcp_{mode}")
    tcp[mode] = [x[0] if x else None for x in rows]
    print(f"  {'TCP ping-pong ' + mode + ', median':<36}{spread(tcp[mode])}")
    print(f"  {'TCP ping-pong ' + mode + ', p99':<36}{spread([x[1] if x else None for x in rows])}")
for tool in ("ib_write_lat", "ib_read_lat", "ib_send_lat"):
    rows = load(tool)
    typical = [x[0] if x else None for x in rows]
    print(f"  {tool + ' -R, t_typical':<36}{spread(typical)}")
    print(f"  {tool + ' -R, 99th percentile':<36}{spread([x[1] if x else None for x in rows])}")
    for mode in ("busy", "blocking"):
        med, per_round = ratios(typical, tcp[mode])
        print(f"  {'  / TCP ' + mode + ': median of ratios':<36}{med:>8}   per round: {per_round}")
EOF
echo
echo "load average $load_before at start, $load_after at end; $cpus CPUs; SIWX_MPA_CRC=$crc"
