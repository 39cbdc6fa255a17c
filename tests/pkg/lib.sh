# tests/pkg/lib.sh - sourced by the tests of tests/pkg/.
#
# TAP lines: ok NAME; notok NAME DETAIL; check NAME DETAIL CMD...;
# tally ("N passed, M failed", status 0 if none failed).
#
# pkg_ns_run TAG BUILD_DIR SCRIPT LEFT: for the tests that install the
# build as a package would lay it out (it_mount_helper, it_units): skip
# (77) without /dev/fuse, overlayfs or a private mount namespace;
# `cmake --install BUILD_DIR --prefix /usr` into T/root (T a new
# /tmp/ferryfs-TAG.* directory); SCRIPT --inner T run in a private mount
# namespace; processes matching "T/LEFT" then killed, T removed. Exits
# with SCRIPT's status. The caller checks root and its own tools first.

n=0
nfail=0
ok() {
	n=$((n + 1))
	echo "ok $n - $1"
}
notok() {
	n=$((n + 1))
	nfail=$((nfail + 1))
	echo "not ok $n - $1: $2"
}
check() {
	local name=$1 detail=$2
	shift 2
	if "$@"; then ok "$name"; else notok "$name" "$detail"; fi
}
tally() {
	echo "$((n - nfail)) passed, $nfail failed"
	[ "$nfail" = 0 ]
}

pkg_ns_run() {
	local tag=$1 build=$2 script=$3 left=$4 T rc p
	if [ ! -c /dev/fuse ]; then
		echo "# skip: no /dev/fuse"
		exit 77
	fi
	modprobe overlay 2>/dev/null || true
	if ! grep -qw overlay /proc/filesystems; then
		echo "# skip: no overlayfs"
		exit 77
	fi
	if ! unshare --mount --propagation private true 2>/dev/null; then
		echo "# skip: no private mount namespace (unshare)"
		exit 77
	fi
	T=$(mktemp -d "/tmp/ferryfs-$tag.XXXXXX") || exit 1
	chmod 0755 "$T"
	if ! DESTDIR=$T/root cmake --install "$build" --prefix /usr \
		>"$T/install.log" 2>&1; then
		cat "$T/install.log"
		echo "not ok 1 - cmake --install into a DESTDIR"
		echo "0 passed, 1 failed"
		rm -rf "$T"
		exit 1
	fi
	unshare --mount --propagation private -- "$script" --inner "$T"
	rc=$?
	# the namespace is gone with its mounts; a process it left is not
	for p in $(pgrep -f -- "$T/$left" 2>/dev/null); do
		echo "# process $p left running: killed"
		kill -9 "$p" 2>/dev/null
	done
	rm -rf "$T"
	exit "$rc"
}
