#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Every rdma_* function the installed librdmacm exports must be exported by
# librdmacm-siwx.so too, with the same version node, so that a preloaded CM
# binds every versioned reference of a program built against rdma-core.
# Usage: check_exports.sh <objdump> <stock librdmacm.so.1> <librdmacm-siwx.so>
set -u
objdump=$1
stock=$2
ours=$3
exports() {
	"$objdump" -T "$1" | grep -v '\*UND\*' | awk '$NF ~ /^rdma_/ { print $(NF-1), $NF }' | sort -u
}
want=$(exports "$stock")
have=$(exports "$ours")
[ -n "$want" ] || { echo "SKIP: no rdma_* export found in $stock"; exit 77; }
missing=$(comm -23 <(printf '%s\n' "$want") <(printf '%s\n' "$have"))
if [ -n "$missing" ]; then
	echo "FAIL: exported by $stock but not by $ours:"
	printf '%s\n' "$missing" | sed 's/^/  /'
	exit 1
fi
echo "all $(printf '%s\n' "$want" | wc -l) rdma_* exports of $stock are in $ours"
