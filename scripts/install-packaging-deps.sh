#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
# Installs what building and checking the siwx packages needs, when missing.
exec "$(dirname "$0")/install-deps.sh" --packaging
