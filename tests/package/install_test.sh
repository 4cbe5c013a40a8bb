#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#
# Install test of the Debian package (CTest label package): builds the .deb
# (scripts/build-packages.sh), installs it into a clean Debian 12 root made
# by mmdebstrap, and there, from the installed paths only, checks that
#   - siwx-run ibv_devices lists siwx_lo,
#   - siwx-run ib_write_bw -R runs between a server and a client process
#     (tests/apps/run_pair.sh, over loopback),
#   - man siwx and man siwx-run show the pages,
#   - apt purge removes every file the package brought.
# The root runs in a private mount namespace (proc, sys and dev mounted for
# it alone) and is deleted afterwards.
#
# Usage: install_test.sh <source dir> <work dir>
#   The base root is cached as a tarball in the work dir; delete it to
#   refresh. SIWX_PACKAGE_DEB=<file> uses a .deb built earlier instead of
#   building one; SIWX_DEBIAN_MIRROR overrides http://deb.debian.org/debian.
# Exit status: 0 pass, 1 fail, 77 skipped (not root, no mount namespace, no
# network to the Debian mirror, packaging tools missing); the reason is
# printed.
set -euo pipefail
src=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
mirror=${SIWX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# The programs the test runs, and the package's run-time dependencies so
# that installing the .deb needs no network.
packages=perftest,ibverbs-utils,man-db,iproute2,procps,libisal2,libnl-3-200,libnl-route-3-200

skip() {
	echo "SKIP: $*"
	exit 77
}
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

[ "$(id -u)" = 0 ] || skip "needs root for the chroot and its mounts; run it as root"
for tool in mmdebstrap dpkg-buildpackage unshare chroot; do
	command -v "$tool" >/dev/null ||
		skip "$tool is missing; scripts/install-packaging-deps.sh installs what this test needs"
done

unshare --mount --propagation private true 2>/dev/null ||
	skip "cannot make a private mount namespace here (a container without CAP_SYS_ADMIN?)"

# The base root: a minimal Debian 12 with apt and the packages above.
key=$(printf '%s %s %s' "$mirror" "$suite" "$packages" | md5sum | cut -c1-12)
base=$work/debian-$suite-$key.tar
if [ ! -s "$base" ]; then
	if ! python3 - "$mirror/dists/$suite/Release" <<'PY' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=20).read(1)
PY
		skip "no network access to the Debian package registry ($mirror)"
	fi
	echo "== mmdebstrap $suite root with $packages"
	rm -rf "$base.tmp"
	mmdebstrap --quiet --variant=apt --format=tar --include="$packages" "$suite" "$base.tmp" "$mirror" ||
		fail "mmdebstrap could not build the root"
	mv "$base.tmp" "$base"
fi

if [ -n "${SIWX_PACKAGE_DEB:-}" ]; then
	deb=$SIWX_PACKAGE_DEB
else
	echo "== building the .deb (log: $work/build-packages.log)"
	if ! "$src/scripts/build-packages.sh" --nocheck --out "$work/packages" \
		>"$work/build-packages.log" 2>&1; then
		tail -n 40 "$work/build-packages.log" >&2
		fail "the package did not build"
	fi
	deb=$(ls "$work"/packages/siwx_*.deb | head -n 1)
fi
[ -f "$deb" ] || fail "no .deb at '$deb'"
echo "== installing $(basename "$deb")"

root=$(mktemp -d "$work/root.XXXXXX")
cleanup() { rm -rf "$root"; }
trap cleanup EXIT
tar -C "$root" -xf "$base"
cp "$deb" "$root/tmp/siwx.deb"
cp "$src/tests/apps/run_pair.sh" "$root/tmp/run_pair.sh"

# What runs inside the root. Paths only from the package: no build tree.
cat >"$root/tmp/inside.sh" <<'INSIDE'
set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
fail() { echo "FAIL: $*" >&2; exit 1; }
# Files that change on their own when packages come and go.
list_files() {
	find / -xdev \( -path /tmp -o -path /run -o -path /var/log -o -path /var/cache \
		-o -path /var/lib/apt -o -path /var/lib/dpkg \) -prune -o -print | sort
	find /var/lib/dpkg/info -name 'siwx*' | sort
}
list_files >/tmp/before.list

apt-get install -y -q /tmp/siwx.deb >/tmp/apt-install.log 2>&1 ||
	{ cat /tmp/apt-install.log; fail "apt-get install of the .deb failed"; }
echo "installed: $(dpkg-query -W -f='${Package} ${Version} depends on ${Depends}' siwx)"
[ -x /usr/bin/siwx-run ] || fail "no /usr/bin/siwx-run"

out=$(siwx-run ibv_devices 2>&1) || fail "siwx-run ibv_devices failed: $out"
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q 'siwx_lo' || fail "siwx-run ibv_devices lists no siwx_lo"
[ -x /usr/bin/siwx ] || fail "no /usr/bin/siwx"
out=$(siwx devices 2>&1) || fail "siwx devices failed: $out"
printf '%s\n' "$out" | grep -q '^siwx_lo .* ACTIVE' || fail "siwx devices lists no active siwx_lo"

bash /tmp/run_pair.sh /usr/bin/siwx-run perftest ib_write_bw ||
	fail "ib_write_bw -R between two processes"

for page in siwx siwx-run; do
	text=$(MANPAGER=cat MANWIDTH=80 man "$page" 2>&1) || fail "man $page: $text"
	printf '%s\n' "$text" | head -n 1
done
MANPAGER=cat man siwx 2>/dev/null | grep -q 'SIWX_MPA_DIALECT' || fail "man siwx lacks the settings"

apt-get purge -y -q siwx >/tmp/apt-purge.log 2>&1 ||
	{ cat /tmp/apt-purge.log; fail "apt-get purge siwx failed"; }
list_files >/tmp/after.list
if ! diff -u /tmp/before.list /tmp/after.list; then
	fail "the files above differ between before install and after purge"
fi
echo "purge left nothing behind ($(wc -l </tmp/before.list) paths compared)"
INSIDE

unshare --mount --propagation private -- /bin/bash -s "$root" <<'NS'
set -eu
root=$1
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys"
mount --rbind /dev "$root/dev"
chroot "$root" /bin/sh /tmp/inside.sh
NS
echo "PASS"
