#!/bin/bash
# package.sh - build the Debian packages ferryfs and ferry-agent from the
# tree, and check them with lintian.
#
# Usage: scripts/package.sh [OUT_DIR]     (default: build-deb/)
#
# Copies the tree as it is (committed or not; not .git, not build*/) to
# OUT_DIR/src/ferryfs-VERSION, runs `dpkg-buildpackage -b -us -uc` there
# (debian/: debhelper compat 13, dh with cmake) and moves the results to
# OUT_DIR (the copy is removed then; the log stays in build.log):
# ferryfs_VERSION_ARCH.deb, ferry-agent_VERSION_ARCH.deb, the
# .buildinfo and .changes. Then lintian on the .changes: the tags it
# prints are in OUT_DIR/lintian.txt; exit 1 if it reports an error or a
# warning (the tags it may report, and why, are in
# debian/*.lintian-overrides).
#
# Installs what the build needs (debhelper, lintian, fakeroot, dpkg-dev
# and debian/control's Build-Depends) with scripts/deps.sh (apt-get) if
# it is missing. Takes ~25 s on 2 cores (a release build of the whole
# tree). The .debs are build products: never committed.
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$SRC/build-deb}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

"$SRC/scripts/deps.sh" debhelper lintian fakeroot dpkg-dev rsync >/dev/null
# debian/control's Build-Depends, as dpkg-checkbuilddeps names the missing
missing=$(cd "$SRC" && dpkg-checkbuilddeps 2>&1 |
	sed -n 's/.*Unmet build dependencies: //p' |
	sed -E 's/\([^)]*\)//g; s/\|[^ ]*//g') || true
if [ -n "$missing" ]; then
	# shellcheck disable=SC2086
	"$SRC/scripts/deps.sh" $missing
fi

version=$(cd "$SRC" && dpkg-parsechangelog -S Version)
# the package's version is the project's (CMakeLists.txt, ferryfs -V)
cmake_version=$(sed -nE 's/^project\(ferryfs VERSION ([0-9.]+).*/\1/p' "$SRC/CMakeLists.txt")
if [ "$version" != "$cmake_version" ]; then
	echo "package: debian/changelog says $version, CMakeLists.txt $cmake_version: add a changelog entry" >&2
	exit 1
fi
arch=$(dpkg --print-architecture)
tree=$OUT/src/ferryfs-$version
rm -rf "$OUT/src"
mkdir -p "$tree"
rsync -a --exclude=/.git --exclude='/build*/' --exclude=/compile_commands.json \
	"$SRC/" "$tree/"
echo "package: dpkg-buildpackage -b -us -uc in $tree"
start=$(date +%s)
(cd "$tree" && dpkg-buildpackage -b -us -uc -j"$(nproc)") >"$OUT/build.log" 2>&1 || {
	tail -n 40 "$OUT/build.log"
	echo "package: dpkg-buildpackage failed (the whole log: $OUT/build.log)" >&2
	exit 1
}
rm -f "$OUT"/*.deb "$OUT"/*.changes "$OUT"/*.buildinfo
mv "$OUT/src"/*.deb "$OUT/src"/*.changes "$OUT/src"/*.buildinfo "$OUT/"
rm -rf "$OUT/src"
changes=$OUT/ferryfs_${version}_${arch}.changes
echo "package: built in $(($(date +%s) - start)) s:"
ls -l "$OUT"/*.deb | sed 's/^/  /'

rc=0
lintian --fail-on error,warning --info --display-info "$changes" >"$OUT/lintian.raw" 2>&1 ||
	rc=$?
# as root lintian says so first: not a tag, left out
grep -v '^running with root privileges is not recommended' "$OUT/lintian.raw" \
	>"$OUT/lintian.txt" || true
rm -f "$OUT/lintian.raw"
if [ -s "$OUT/lintian.txt" ]; then
	echo "package: lintian says:"
	sed 's/^/  /' "$OUT/lintian.txt"
else
	echo "package: lintian: no tag (errors, warnings, info; overridden: see debian/*.lintian-overrides)"
fi
if [ "$rc" != 0 ]; then
	echo "package: lintian failed (exit $rc): an error or a warning above" >&2
	exit 1
fi
