#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#
# Builds the siwx packages from a copy of this tree (the tree itself stays
# clean): the Debian binary package with dpkg-buildpackage, and with --rpm
# the RPM with rpmbuild --nodeps (on Debian a check of the spec and its file
# list; see the README). Each package is then checked with lintian or rpmlint
# (with rpm/siwx.rpmlintrc): an error fails the script, warnings are shown.
# Needs scripts/install-packaging-deps.sh.
#
# Usage: scripts/build-packages.sh [--rpm] [--no-deb] [--nocheck] [--out DIR]
#   --out DIR   where the packages go (default build/packages); the copy
#               of the tree is DIR/src, rpmbuild's tree DIR/rpmbuild
#   --nocheck   skip the unit tests in the package builds
# Honours CMAKE_C_COMPILER_LAUNCHER / CMAKE_CXX_COMPILER_LAUNCHER (ccache).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/build/packages
deb=1 rpm=0 nocheck=0
while [ $# -gt 0 ]; do
  case $1 in
    --rpm) rpm=1 ;;
    --no-deb) deb=0 ;;
    --nocheck) nocheck=1 ;;
    --out) out=$2; shift ;;
    *) echo "usage: $0 [--rpm] [--no-deb] [--nocheck] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(sed -n 's/^project(siwx VERSION \([0-9.]*\).*/\1/p' "$top/CMakeLists.txt")
jobs=$(nproc)

# The sources: what git tracks plus new files it does not ignore.
src=$out/src/siwx-$version
rm -rf "$out/src"
mkdir -p "$src"
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$top" && git ls-files -z --cached --others --exclude-standard |
     tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$src"
else
  tar -C "$top" --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$src"
fi

if [ "$deb" = 1 ]; then
  echo "== dpkg-buildpackage -us -uc -b"
  opts="parallel=$jobs"
  [ "$nocheck" = 1 ] && opts="$opts nocheck"
  rm -f "$out"/src/*.deb
  (cd "$src" && DEB_BUILD_OPTIONS="$opts" dpkg-buildpackage -us -uc -b)
  mv -f "$out"/src/*.deb "$out"/src/*.changes "$out"/src/*.buildinfo "$out"/
  ls "$out"/*.deb
  echo "== lintian"
  lintian --info --pedantic "$out"/siwx_"$version"_*.changes 2>&1 |
    grep -v '^running with root privileges' || true
  lintian --fail-on error -q "$out"/siwx_"$version"_*.changes >/dev/null 2>&1 ||
    { echo "lintian reports errors (above)" >&2; exit 1; }
fi

if [ "$rpm" = 1 ]; then
  echo "== rpmbuild -bb --nodeps"
  mkdir -p "$out/rpmbuild/SOURCES"
  tar -C "$out/src" --exclude="siwx-$version/obj-*" --exclude="siwx-$version/debian/siwx" \
      -czf "$out/rpmbuild/SOURCES/siwx-$version.tar.gz" "siwx-$version"
  rpm_opts=()
  [ "$nocheck" = 1 ] && rpm_opts+=(--without check)
  rpmbuild -bb --nodeps "${rpm_opts[@]}" --define "_topdir $out/rpmbuild" \
      --define "_smp_mflags -j$jobs" "$top/rpm/siwx.spec"
  find "$out/rpmbuild/RPMS" -name '*.rpm' -exec mv -f {} "$out"/ \;
  ls "$out"/*.rpm
  echo "== rpmlint"
  rpmlint -r "$top/rpm/siwx.rpmlintrc" "$out"/siwx-"$version"-*.rpm "$top/rpm/siwx.spec"
fi
