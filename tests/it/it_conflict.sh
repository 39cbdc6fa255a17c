#!/bin/bash
# it_conflict.sh FERRYFS - other writers of the share (issue 5): as root,
# registered with ctest (label "mount"). A directory plays the share (the
# path driver); "on the share" below means written there directly, behind
# the mount. Mounts of its own (write-back, the daemon in the foreground,
# our child), so that it can kill -9 one.
#
#   1. revalidation: a file changed on the share is seen at the next open,
#      whether the journal never knew it or wrote and flushed it before;
#   2. conflict found by an open: flusher paused, a file rewritten through
#      the mount, changed on the share; the next open sees the share's
#      version at the name and the local one at NAME.conflict-*; after
#      resume and flush --wait the share has both (SHA-256), status counts
#      the conflict and names the copy, the log has one warning naming
#      both;
#   3. the same for a file changed in place through the mount (a partial
#      write: the journal fills its chunk from the share first);
#   4. conflict found by the flusher: nothing looks at the file through
#      the mount after the change on the share; resume, flush --wait; a
#      chmod alone is no conflict;
#   5. no false conflict: write, flush, rewrite, rewrite while the flusher
#      sends it (throttled), partial writes, and a kill -9 of the daemon
#      mid-flush then a new mount on the same journal: every file ends as
#      written, no conflict counted, no copy made;
#   6. conflict found by an open while the kernel caches names and
#      attributes (so that the open is the only request).
#
# Exit 0 if every check passed, 1 if not, 77 without root or /dev/fuse.
set -u

FERRYFS=${1:?usage: it_conflict.sh FERRYFS}
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ] ||
	! command -v fusermount3 >/dev/null; then
	echo "it_conflict: skip: needs root, /dev/fuse and fusermount3"
	exit 77
fi
FERRYFS=$(readlink -f "$FERRYFS")
T=$(mktemp -d /tmp/ferryfs-conflict.XXXXXX) || exit 1
R=$T/remote M=$T/mnt J=$T/journal S=$T/src
mkdir -p "$R" "$M" "$S"
OPTS="-o journal=$J,cache=$T/cache,streams=4,chunk_size=1Mi"
DPID=
pass=0
fail=0
logs=0

ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $1"; }
bad() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $1: $2"; }
is() { # is NAME GOT WANT
	if [ "$2" = "$3" ]; then ok "$1"; else bad "$1" "got '$2', want '$3'"; fi
}

is_mounted() {
	awk -v m="$M" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo
}

cleanup() {
	[ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null
	wait 2>/dev/null
	is_mounted && { fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"; }
	if [ "$fail" = 0 ]; then
		rm -rf "$T"
	else
		for f in "$T"/daemon.*.log; do
			echo "# ---- $f"
			tail -n 40 "$f"
		done
		echo "# kept $T"
	fi
}
trap cleanup EXIT

mount_it() { # mount_it [OPTS...]
	logs=$((logs + 1))
	"$FERRYFS" mount "$R" "$M" -f $OPTS "$@" >"$T/daemon.$logs.log" 2>&1 &
	DPID=$!
	for _ in $(seq 1 100); do
		is_mounted && return 0
		kill -0 "$DPID" 2>/dev/null || break
		sleep 0.05
	done
	echo "# mount failed: $(cat "$T/daemon.$logs.log")"
	exit 1
}

umount_it() {
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		fusermount3 -u "$M" 2>/dev/null && break
		sleep 0.3
	done
	wait "$DPID" 2>/dev/null
	DPID=
}

sha() { sha256sum <"$1" | cut -d' ' -f1; }
as_written() { # as_written NAME: n1 n2 n3 big on the share as in $S
	local f
	for f in n1 n2 n3 big; do
		if [ "$(sha "$R/$f")" != "$(sha "$S/$f")" ]; then
			bad "$1" "a SHA-256 differs"
			return
		fi
	done
	ok "$1"
}
status_json() { "$FERRYFS" status "$M" --json; }
json_field() { # json_field KEY
	status_json | python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"
}
copies() { # copies NAME: the conflict copies of NAME on the share
	find "$R" -maxdepth 1 -name "$1.conflict-*" -printf '%f\n' | sort
}
# the kernel's attribute and entry caches (1 s) run out: the next open,
# stat or lookup reaches the daemon
settle() { sleep 1.2; }

mount_it

# --- 1. revalidation -------------------------------------------------------
echo "first version" >"$R/r1"
is "a file put on the share reads through the mount" "$(cat "$M/r1")" "first version"
echo "second version, longer" >"$R/r1"
settle
is "changed on the share: the next open sees the new content" "$(cat "$M/r1")" \
	"second version, longer"

echo "written here" >"$M/r2"
"$FERRYFS" flush "$M" --wait >/dev/null
echo "changed on the share after our flush" >"$R/r2"
settle
is "a file written and flushed here, then changed on the share: the next open sees the share's" \
	"$(cat "$M/r2")" "changed on the share after our flush"

# --- 2. conflict found by an open (a file rewritten whole here) ------------
head -c 300000 /dev/urandom >"$S/c1.base"
head -c 200000 /dev/urandom >"$S/c1.local"
head -c 250000 /dev/urandom >"$S/c1.share"
cp "$S/c1.base" "$R/c1"
cmp -s "$S/c1.base" "$M/c1" && ok "c1: the share's file reads through the mount" ||
	bad "c1: the share's file reads through the mount" "differs"
"$FERRYFS" pause "$M" >/dev/null
cp "$S/c1.local" "$M/c1"
cat "$S/c1.share" >"$R/c1" # in place: the same inode, another content
settle
cmp -s "$S/c1.share" "$M/c1" && ok "c1: the next open shows the share's version at the name" ||
	bad "c1: the next open shows the share's version at the name" "$(sha "$M/c1")"
c1copy=$(find "$M" -maxdepth 1 -name 'c1.conflict-*' -printf '%f\n')
case "$c1copy" in
c1.conflict-[0-9][0-9][0-9][0-9][0-1][0-9][0-3][0-9]-[0-2][0-9][0-5][0-9][0-6][0-9])
	ok "c1: the local version is visible as $c1copy" ;;
*) bad "c1: the local version is visible as c1.conflict-YYYYmmdd-HHMMSS" "'$c1copy'" ;;
esac
cmp -s "$S/c1.local" "$M/$c1copy" && ok "c1: the conflict copy holds the local version" ||
	bad "c1: the conflict copy holds the local version" "differs"
is "c1: status counts the conflict (paused)" "$(json_field conflicts)" 1
"$FERRYFS" resume "$M" >/dev/null
"$FERRYFS" flush "$M" --wait >/dev/null && ok "c1: flush --wait" || bad "c1: flush --wait" "failed"
is "c1: the share has its version at the name (SHA-256)" "$(sha "$R/c1")" "$(sha "$S/c1.share")"
is "c1: the share has the local version at the conflict name (SHA-256)" \
	"$(sha "$R/$c1copy" 2>/dev/null)" "$(sha "$S/c1.local")"
is "c1: one conflict copy on the share" "$(copies c1)" "$c1copy"
settle
cmp -s "$S/c1.share" "$M/c1" && cmp -s "$S/c1.local" "$M/$c1copy" &&
	ok "c1: both versions through the mount after the flush" ||
	bad "c1: both versions through the mount after the flush" "differ"
json=$(status_json)
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["conflicts"] == 1, d["conflicts"]
assert d["conflict_paths"] == [sys.argv[2]], d["conflict_paths"]
assert d["drained"] and d["failed_ops"] == 0
' "$json" "$c1copy" && ok "c1: status --json: conflicts 1, conflict_paths names the copy" ||
	bad "c1: status --json: conflicts 1, conflict_paths names the copy" "$json"
out=$("$FERRYFS" status "$M")
grep -q "conflicts: 1" <<<"$out" && grep -qF "    $c1copy" <<<"$out" &&
	ok "c1: status (human) counts the conflict and names the copy" ||
	bad "c1: status (human) counts the conflict and names the copy" "$out"
n=$(grep -c "conflict: 'c1' was changed on the share.*keeps 'c1'.*kept as '$c1copy'" \
	"$T/daemon.$logs.log")
is "c1: one warning in the log naming both" "$n" 1
v=$(getfattr --absolute-names --only-values -n user.ferryfs.state "$M/$c1copy" 2>&1)
is "c1: the flushed copy's state is clean" "$v" clean

# --- 3. conflict found by an open (a file changed in place here) ----------
head -c $((3 << 20)) /dev/urandom >"$S/c2.base"
head -c 4096 /dev/urandom >"$S/c2.patch"
head -c $((2 << 20)) /dev/urandom >"$S/c2.share"
cp "$S/c2.base" "$R/c2"
cp "$S/c2.base" "$S/c2.local"
dd if="$S/c2.patch" of="$S/c2.local" bs=4096 seek=100 conv=notrunc status=none
"$FERRYFS" pause "$M" >/dev/null
settle
dd if="$S/c2.patch" of="$M/c2" bs=4096 seek=100 conv=notrunc status=none
cat "$S/c2.share" >"$R/c2"
settle
stat "$M/c2" >/dev/null # a lookup/stat finds it this time
c2copy=$(find "$M" -maxdepth 1 -name 'c2.conflict-*' -printf '%f\n')
[ -n "$c2copy" ] && ok "c2: stat found the conflict: $c2copy" ||
	bad "c2: stat found the conflict" "no c2.conflict-* in $(ls "$M")"
cmp -s "$S/c2.share" "$M/c2" && ok "c2: the share's version at the name" ||
	bad "c2: the share's version at the name" "differs"
# chunks of 1 MiB: the patched one was filled from the base; the rest of
# the copy comes from the share's current version (README "Conflicts")
python3 - "$S/c2.local" "$S/c2.share" "$S/c2.expect" <<'EOF'
import sys
loc = open(sys.argv[1], "rb").read()
shr = open(sys.argv[2], "rb").read()
mib = 1 << 20
out = bytearray(shr[:len(loc)].ljust(len(loc), b"\0"))
out[0:mib] = loc[0:mib]
open(sys.argv[3], "wb").write(out)
EOF
"$FERRYFS" resume "$M" >/dev/null
"$FERRYFS" flush "$M" --wait >/dev/null
is "c2: the share has its version at the name (SHA-256)" "$(sha "$R/c2")" "$(sha "$S/c2.share")"
is "c2: the copy is the local chunk over the share's bytes (SHA-256)" \
	"$(sha "$R/${c2copy:-none}" 2>/dev/null)" "$(sha "$S/c2.expect")"

# --- 4. conflict found by the flusher --------------------------------------
head -c 500000 /dev/urandom >"$S/c3.base"
head -c 700000 /dev/urandom >"$S/c3.local"
head -c 100000 /dev/urandom >"$S/c3.share"
cp "$S/c3.base" "$R/c3"
cat "$M/c3" >/dev/null
exec 9<"$M/c3" # the kernel keeps the inode of the name: it must follow
"$FERRYFS" pause "$M" >/dev/null
cp "$S/c3.local" "$M/c3"
cat "$S/c3.share" >"$R/c3"
# nothing looks at c3 through the mount from here on
"$FERRYFS" resume "$M" >/dev/null
"$FERRYFS" flush "$M" --wait >/dev/null && ok "c3: flush --wait" || bad "c3: flush --wait" failed
c3copy=$(copies c3)
[ -n "$c3copy" ] && ok "c3: the flusher found the conflict: $c3copy" ||
	bad "c3: the flusher found the conflict" "no c3.conflict-* on the share"
is "c3: the share's version kept its name (SHA-256)" "$(sha "$R/c3")" "$(sha "$S/c3.share")"
is "c3: the local version at the conflict name (SHA-256)" \
	"$(sha "$R/${c3copy:-none}" 2>/dev/null)" "$(sha "$S/c3.local")"
settle
cmp -s "$S/c3.share" "$M/c3" && cmp -s "$S/c3.local" "$M/${c3copy:-none}" &&
	ok "c3: both versions through the mount" ||
	bad "c3: both versions through the mount" "differ: c3 is $(stat -c %s "$M/c3") bytes (the share's \
version $(stat -c %s "$S/c3.share"), $(cmp "$S/c3.share" "$M/c3" 2>&1 | head -1); the copy \
$(stat -c %s "$M/${c3copy:-none}" 2>&1) (the local version $(stat -c %s "$S/c3.local")), \
$(cmp "$S/c3.local" "$M/${c3copy:-none}" 2>&1 | head -1)"
exec 9<&-
# only attributes changed here: not a conflict, they go to the share's
# version
head -c 5000 /dev/urandom >"$R/a5"
cat "$M/a5" >/dev/null
"$FERRYFS" pause "$M" >/dev/null
chmod 600 "$M/a5"
head -c 7000 /dev/urandom >"$S/a5"
cat "$S/a5" >"$R/a5"
settle
stat "$M/a5" >/dev/null
"$FERRYFS" resume "$M" >/dev/null
"$FERRYFS" flush "$M" --wait >/dev/null
settle
is "a5: a chmod alone is no conflict (no copy)" "$(copies a5)" ""
is "a5: the share's content with the mode set here" \
	"$(sha "$R/a5") $(stat -c %a "$R/a5")" "$(sha "$S/a5") 600"
cmp -s "$S/a5" "$M/a5" && ok "a5: the mount shows the share's content" ||
	bad "a5: the mount shows the share's content" "differs"
is "status counts 3 conflicts" "$(json_field conflicts)" 3
umount_it

# --- 5. no false conflict ----------------------------------------------------
mount_it -o remote_stream_rate=2M
for i in 1 2 3; do
	head -c 200000 /dev/urandom >"$R/n$i"
	cat "$M/n$i" >/dev/null
done
for round in 1 2 3; do
	for i in 1 2 3; do
		head -c $((100000 * round + i)) /dev/urandom >"$S/n$i"
		cp "$S/n$i" "$M/n$i"
	done
	dd if=/dev/urandom of="$M/n1" bs=1000 count=1 seek=7 conv=notrunc status=none
	dd if="$M/n1" of="$S/n1" bs=1M status=none
	"$FERRYFS" flush "$M" --wait >/dev/null
done
# rewritten while the flusher sends it (2 MB/s per stream)
head -c $((12 << 20)) /dev/urandom >"$S/big"
cp "$S/big" "$M/big"
"$FERRYFS" flush "$M" --wait >/dev/null
head -c $((12 << 20)) /dev/urandom >"$S/big"
cp "$S/big" "$M/big"
sleep 1
head -c $((12 << 20)) /dev/urandom >"$S/big"
cp "$S/big" "$M/big"
"$FERRYFS" flush "$M" --wait >/dev/null
as_written "rewrites and flushes: every file on the share as written"
is "rewrites and flushes: no new conflict" "$(json_field conflicts)" 3
# kill -9 mid-flush, then a new mount on the same journal
head -c $((12 << 20)) /dev/urandom >"$S/big"
cp "$S/big" "$M/big"
sync "$M/big"
for i in 1 2 3; do
	head -c 300000 /dev/urandom >"$S/n$i"
	cp "$S/n$i" "$M/n$i"
	sync "$M/n$i"
done
sleep 0.7
kill -KILL "$DPID"
wait "$DPID" 2>/dev/null
DPID=
fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"
mount_it
for f in n1 n2 n3 big; do
	stat "$M/$f" >/dev/null
	cat "$M/$f" >/dev/null
done
"$FERRYFS" flush "$M" --wait >/dev/null && ok "after kill -9: flush --wait" ||
	bad "after kill -9: flush --wait" failed
as_written "after kill -9: every fsynced file on the share as written"
is "after kill -9: no new conflict" "$(json_field conflicts)" 3
umount_it

# --- 6. conflict found by an open (names and attributes cached) ----------
mount_it -o entry_timeout=3600,attr_timeout=3600
head -c 100000 /dev/urandom >"$S/c4.local"
head -c 120000 /dev/urandom >"$S/c4.share"
echo base >"$R/c4"
stat "$M/c4" >/dev/null
"$FERRYFS" pause "$M" >/dev/null
cp "$S/c4.local" "$M/c4"
cat "$S/c4.share" >"$R/c4"
# the kernel asks nothing but the open: no lookup, no getattr
cmp -s "$S/c4.share" "$M/c4" && ok "c4: an open finds the conflict, the share's version at the name" ||
	bad "c4: an open finds the conflict, the share's version at the name" "differs"
"$FERRYFS" resume "$M" >/dev/null
"$FERRYFS" flush "$M" --wait >/dev/null
c4copy=$(copies c4)
is "c4: the local version at the conflict name (SHA-256)" \
	"$(sha "$R/${c4copy:-none}" 2>/dev/null)" "$(sha "$S/c4.local")"
is "c4: the share's version kept its name (SHA-256)" "$(sha "$R/c4")" "$(sha "$S/c4.share")"
n=$(find "$R" -name '*.conflict-*' | wc -l)
is "four conflict copies on the share in all" "$n" 4
n=$(cat "$T"/daemon.*.log | grep -c "conflict:")
is "four conflict warnings in the logs in all" "$n" 4
umount_it

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
