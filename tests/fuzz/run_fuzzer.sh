#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# run_fuzzer.sh BINARY SEED_CORPUS WORK_CORPUS SECONDS
# Fuzzes BINARY for SECONDS from a private copy of SEED_CORPUS and prints
# libFuzzer's final statistics (executions, coverage). Fails on any finding.
set -euo pipefail
bin=$1 seeds=$2 work=$3 seconds=$4
mkdir -p "$work"
if [ -d "$seeds" ]; then cp -n "$seeds"/* "$work"/ 2>/dev/null || true; fi
artifacts=$(dirname "$work")/artifacts/
mkdir -p "$artifacts"
exec "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
  -rss_limit_mb=2048 -artifact_prefix="$artifacts" "$work"
