#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Runs mpi_check (tests/apps/mpi_check.c) as a 2-rank Open MPI job on this
# host over siwx: Open MPI's cm PML with the ofi MTL, libfabric's
# verbs;ofi_rxm provider, each rank under siwx-run. The only path for the
# data is therefore verbs RC QPs on a siwx device: the cm PML uses no BTL
# for messages (and only btl self is allowed), the MTL may use the verbs
# provider only, and the job fails if that cannot be opened. The check
# also asks for the evidence: the MTL reports a siwx_* fabric domain, and
# siwx logs the MPA connections between the ranks.
#
# Usage: run_mpi.sh <siwx-run> <mpi_check binary or empty> [mpirun]
# Exit status: 0 pass, 1 fail, 77 skipped (no Open MPI, no mpi_check built,
# or no non-loopback IPv4 address: libfabric's verbs provider skips
# loopback interfaces).
set -u
run=$1
binary=${2:-}
mpirun=${3:-mpirun.openmpi}
: "${SIWX_APPS_TIMEOUT:=120}"

if [ -z "$binary" ] || [ ! -x "$binary" ]; then
	echo "SKIP: mpi_check was not built (no Open MPI mpicc at configure time)"
	exit 77
fi
if ! command -v "$mpirun" >/dev/null || ! "$mpirun" --version 2>&1 | grep -Eq 'Open ?(MPI|RTE)'; then
	echo "SKIP: no Open MPI mpirun ($mpirun)"
	exit 77
fi
# The interface of the first non-loopback IPv4 address (eth0 on the CI
# machines): libfabric's verbs provider lists only such interfaces.
iface=$(ip -4 -o addr show 2>/dev/null | awk '$2 != "lo" { print $2; exit }')
if [ -z "$iface" ]; then
	echo "SKIP: no non-loopback IPv4 address (libfabric's verbs provider ignores loopback)"
	exit 77
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# --allow-run-as-root: CI runs as root. --oversubscribe: 2 ranks on any core
# count. pml cm + mtl ofi overrides Debian's openmpi-mca-params.conf
# (mtl = ^ofi). mtl_base_verbose 10 prints the provider's domain name.
timeout -k 10 "$SIWX_APPS_TIMEOUT" "$mpirun" --allow-run-as-root --oversubscribe \
	-np 2 -host localhost:2 \
	--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include verbs --mca btl self \
	--mca mtl_base_verbose 10 \
	-x FI_PROVIDER=verbs -x FI_VERBS_IFACE="$iface" -x SIWX_LOG_LEVEL=info \
	"$run" -- "$binary" >"$log" 2>&1
status=$?

fail() {
	echo "FAIL: $*" >&2
	echo "--- mpirun output:" >&2
	cat "$log" >&2
	exit 1
}

[ "$status" -eq 0 ] || fail "mpirun exited with $status"
grep -q '^mpi_check: all checks passed' "$log" || fail "mpi_check did not pass every check"
# Both ranks chose a siwx device through the verbs provider.
domains=$(grep -c 'mtl:ofi:provider: siwx_' "$log")
[ "$domains" -eq 2 ] || fail "$domains ranks report a siwx fabric domain, expected 2"
# And their connection went through siwx's MPA negotiation (RFC 5044/6581).
grep -q 'siwx: info: .* connected as Initiator with ' "$log" || fail "no siwx connection"
grep -q 'siwx: info: .* accepted as Responder with ' "$log" || fail "no siwx connection"
grep '^mpi_check: ' "$log"
echo "(2 ranks, pml cm, mtl ofi, verbs;ofi_rxm on siwx_$iface)"
exit 0
