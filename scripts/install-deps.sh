#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Installs every Debian package siwx needs to build, test and benchmark, when
# missing. Safe to run again; does nothing when all are present.
# With --packaging: instead, what building and checking the siwx packages
# needs (dpkg-buildpackage and debhelper, lintian, rpmbuild and rpmlint for
# the spec check, mmdebstrap for the install test's clean root).
set -euo pipefail

what="packages"
packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  # libraries the product is built on
  libisal-dev libibverbs-dev librdmacm-dev libnl-3-dev libnl-route-3-dev
  # test and benchmark frameworks
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  # unmodified applications and baselines the tests and benchmarks run
  rdma-core ibverbs-utils rdmacm-utils perftest iperf3 iproute2
  # the plots of perftest-configs/run
  python3-matplotlib
  # libfabric's fi_pingpong, for the libfabric verbs-provider test
  libfabric-bin
  # Open MPI (mpirun, mpicc), for the MPI-over-iWARP test (apps.mpi)
  openmpi-bin libopenmpi-dev
  # the rdma-core Python binding, for the pyverbs smoke test
  python3-pyverbs
  # the two-host tests: NFQUEUE rules and the userspace impairment on them
  iptables libnetfilter-queue-dev
  # the SIWX_TRACE test decodes the trace as iWARP with Wireshark's dissectors
  tshark
)
if [ "${1:-}" = "--packaging" ]; then
  what="packaging tools"
  packages=(dpkg-dev debhelper devscripts fakeroot lintian rpm rpmlint mmdebstrap
            python3 man-db)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "siwx: installing missing $what: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    sudo="sudo"
  else
    echo "siwx: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# tshark's wireshark-common asks whether non-root users may capture: no.
if printf '%s\n' "${missing[@]}" | grep -qx tshark; then
  echo "wireshark-common wireshark-common/install-setuid boolean false" |
    $sudo debconf-set-selections
fi
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
