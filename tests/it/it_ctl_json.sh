#!/bin/bash
# it_ctl_json.sh FERRYFS - the control protocol's JSON (issue 38): a mount
# point and a remote whose names hold quotes, backslashes, spaces and
# control characters, in write-back and in write-through
# (-o writeback=off), and a mount with -o streams=64 (its status used to
# pass the 8 KiB reply buffer: "No space left on device"):
#   `status --json` is valid JSON (python3's json) and gives back the
#   mount point and the remote as they are; the status of 64 streams has
#   64; `status` (text) and `flush --wait` work and the data is on the
#   share. A name that is not UTF-8 gets U+FFFD for its bad byte.
# Registered directly with ctest (label "mount"); mounts by itself in a
# private temp dir. Prints "ok N - name" / "not ok N - name: detail".
# Exit 1 on failure, 77 without root, /dev/fuse, fusermount3 or python3.
set -u

if [ $# -ne 1 ]; then
	echo "usage: it_ctl_json.sh FERRYFS" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "# skip: needs root and /dev/fuse"
	exit 77
fi
for tool in fusermount3 python3 mountpoint timeout; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "# skip: no $tool"
		exit 77
	fi
done
FERRYFS=$(readlink -f "$1")

T=$(mktemp -d /tmp/ferryfs-json.XXXXXX) || exit 1
chmod 0755 "$T"
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
bad() { n=$((n + 1)); fail=$((fail + 1)); echo "not ok $n - $1: $2"; }
M=
DPID=
logs=0

# names with a quote, a backslash, a space, a tab and \x01
WEIRD=$'we "ir" d\\x \t\x01end'

is_mounted() { [ -n "$M" ] && mountpoint -q "$M" 2>/dev/null; }
cleanup() {
	is_mounted && { fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"; }
	[ -n "$DPID" ] && wait "$DPID" 2>/dev/null
	if [ "$fail" = 0 ]; then
		rm -rf "$T"
	else
		for f in "$T"/daemon.*.log; do
			echo "# ---- $f"
			tail -n 20 "$f"
		done
		echo "# kept $T"
	fi
}
trap cleanup EXIT

mount_it() { # mount_it REMOTE MNT [OPTS...]
	local r=$1
	M=$2
	shift 2
	logs=$((logs + 1))
	"$FERRYFS" mount "$r" "$M" -f -o "journal=$T/j.$logs,cache=$T/c.$logs" \
		"$@" >"$T/daemon.$logs.log" 2>&1 &
	DPID=$!
	for _ in $(seq 1 100); do
		is_mounted && return 0
		kill -0 "$DPID" 2>/dev/null || break
		sleep 0.05
	done
	bad "mount $*" "$(cat "$T/daemon.$logs.log")"
	exit 1
}

umount_it() {
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		fusermount3 -u "$M" 2>/dev/null && break
		sleep 0.3
	done
	wait "$DPID" 2>/dev/null
	DPID=
	M=
}

# check_json WHAT REMOTE MNT STREAMS: status --json parses, names the mount
# point and the remote as they are, has STREAMS streams
check_json() {
	local what=$1 r=$2 m=$3 streams=$4 json err
	json=$("$FERRYFS" status "$m" --json 2>"$T/err")
	err=$(cat "$T/err")
	if out=$(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["ok"], "ok is not true"
assert d["mountpoint"] == sys.argv[2], "mountpoint %r" % d["mountpoint"]
assert d["remote"] == "path:" + sys.argv[3], "remote %r" % d["remote"]
assert len(d["streams"]) == int(sys.argv[4]), "%d streams" % len(d["streams"])
' "$json" "$m" "$r" "$streams" 2>&1); then
		ok "$what: status --json is JSON with the names as they are"
	else
		bad "$what: status --json is JSON with the names as they are" \
			"$(tail -n1 <<<"$out"); reply: ${json:0:300} $err"
	fi
}

# check_flush WHAT REMOTE MNT: a file written, status and flush --wait
check_flush() {
	local what=$1 r=$2 m=$3 out
	echo "$what" >"$m/file"
	if out=$("$FERRYFS" status "$m" 2>&1) && grep -qF "pending:" <<<"$out"; then
		ok "$what: status"
	else
		bad "$what: status" "$out"
	fi
	if out=$(timeout 60 "$FERRYFS" flush "$m" --wait 2>&1) &&
		[ "$(cat "$r/file" 2>/dev/null)" = "$what" ]; then
		ok "$what: flush --wait, the file is on the share"
	else
		bad "$what: flush --wait, the file is on the share" "$out"
	fi
}

R=$T/remote$WEIRD
MP=$T/mnt$WEIRD
mkdir "$R" "$MP"

mount_it "$R" "$MP" -o cache_local
check_json "write-back, odd names" "$R" "$MP" 4
check_flush "write-back, odd names" "$R" "$MP"
check_json "write-back, odd names, after the flush" "$R" "$MP" 4
umount_it

mount_it "$R" "$MP" -o writeback=off
check_json "write-through, odd names" "$R" "$MP" 0
check_flush "write-through, odd names" "$R" "$MP"
umount_it

# a name that is not UTF-8: its bad byte comes as U+FFFD, the reply is
# still JSON
RX=$T/remote$'\xff'x
MX=$T/mnt$'\xff'x
mkdir "$RX" "$MX"
mount_it "$RX" "$MX" -o writeback=off
json=$("$FERRYFS" status "$MX" --json 2>&1)
if python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["mountpoint"].endswith("mnt\ufffdx"), d["mountpoint"]
' "$json" 2>/dev/null; then
	ok "a name that is not UTF-8: status --json is JSON, U+FFFD for the byte"
else
	bad "a name that is not UTF-8: status --json is JSON, U+FFFD for the byte" "$json"
fi
umount_it

R64=$T/remote64
M64=$T/mnt64
mkdir "$R64" "$M64"
mount_it "$R64" "$M64" -o streams=64
check_json "64 streams" "$R64" "$M64" 64
check_flush "64 streams" "$R64" "$M64"
umount_it

echo "$((n - fail)) passed, $fail failed"
[ "$fail" -eq 0 ]
