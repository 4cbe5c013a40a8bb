#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#
# Installs what building and checking the siwx packages needs, when missing:
# dpkg-buildpackage and debhelper, lintian, rpmbuild and rpmlint (the spec
# check), mmdebstrap (the install test's clean root). Safe to run again.
set -euo pipefail

packages=(dpkg-dev debhelper devscripts fakeroot lintian rpm rpmlint mmdebstrap
          python3 man-db)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "siwx: installing missing packaging tools: ${missing[*]}"
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
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
