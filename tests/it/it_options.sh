#!/bin/bash
# it_options.sh FERRYFS - the write-back options and the journal's refusals,
# each on a mount of its own (issue 3). As root, registered with ctest
# (label "mount").
#
#   sync=remote        close() returns once the file is on the share
#   bwlimit=RATE       the flush goes no faster than RATE
#   verify=readback    the flush reads every chunk back; data arrives
#   journal_max=SIZE   a writer bigger than the bound waits for the flush,
#                      does not fail; status counts the waits
#   another share      a journal mounted over another share is refused,
#                      one line, exit != 0, and nothing is mounted
#   corrupted journal  one clear line, exit != 0, no crash
#   cache_ttl=SEC      a stat within SEC keeps a file's cached attributes,
#                      the next open sees the share's change; 0: at once
#   a local share      read directly, no block cache made; cache_local
#                      and a throttled share go through the cache
#   max_read=BYTES     mounts (libfuse wants it twice: mount option and
#                      init) and reads right; out of range is refused
#   max_background=N   out of range is refused (every other mount here
#                      runs with the default, 64)
set -u
FERRYFS=${1:?usage: it_options.sh FERRYFS}
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "it_options: skip: needs root and /dev/fuse"
	exit 77
fi
FERRYFS=$(readlink -f "$FERRYFS")
T=$(mktemp -d /var/tmp/ferryfs-options.XXXXXX) || exit 1
M=$T/mnt
mkdir -p "$M"
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $1"; }
bad() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $1: $2"; }
is_mounted() { awk -v m="$M" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }
umount_it() {
	is_mounted && { fusermount3 -u "$M" || fusermount3 -uz "$M"; }
	for _ in $(seq 1 100); do pgrep -f "ferryfs mount $T/" >/dev/null || break; sleep 0.1; done
}
trap 'umount_it; rm -rf "$T"' EXIT
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
ms() { echo $(($(date +%s%N) / 1000000)); }
# mount_with NAME OPTS: a fresh share $T/NAME, journal $T/NAME.j
mount_with() {
	mkdir -p "$T/$1"
	"$FERRYFS" mount "$T/$1" "$M" -o "journal=$T/$1.j,cache=$T/$1.c,$2" 2>"$T/err"
}
# refused NAME OPT REASON: a mount of $T/NAME with OPT fails, saying REASON
refused() {
	if "$FERRYFS" mount "$T/$1" "$M" -o "journal=$T/$1.j,$2" 2>"$T/err"; then
		bad "$2 is refused" "mounted"
		umount_it
	else
		grep -q "$3" "$T/err" && ok "$2 is refused: $(cat "$T/err")" ||
			bad "$2 is refused with the reason" "$(cat "$T/err")"
	fi
}

# --- sync=remote -------------------------------------------------------------
mount_with sync "sync=remote,remote_latency=20ms" || bad "mount sync=remote" "$(cat "$T/err")"
echo hello >"$M/f"
[ "$(cat "$T/sync/f" 2>/dev/null)" = hello ] &&
	ok "sync=remote: on the share when close() returned" ||
	bad "sync=remote: on the share when close() returned" "$(ls -l "$T/sync")"
python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND); os.write(fd, b"more\n"); os.fsync(fd); print(open(sys.argv[2]).read().count("more"))' \
	"$M/f" "$T/sync/f" | grep -qx 1 &&
	ok "sync=remote: on the share when fsync() returned" ||
	bad "sync=remote: on the share when fsync() returned" "$(cat "$T/sync/f")"
umount_it

# --- bwlimit ---------------------------------------------------------------
mount_with bw "bwlimit=8M,streams=4,chunk_size=1Mi" || bad "mount bwlimit" "$(cat "$T/err")"
head -c $((24 << 20)) /dev/urandom >"$T/src24"
t0=$(ms)
cp "$T/src24" "$M/big"
"$FERRYFS" flush "$M" --wait >/dev/null
t1=$(ms)
el=$((t1 - t0))
# 24 MiB at 8 MB/s: 3.1 s (less the bucket's burst)
[ "$el" -ge 2500 ] && cmp -s "$T/src24" "$T/bw/big" &&
	ok "bwlimit=8M: 24 MiB reached the share in $el ms (>= 2500)" ||
	bad "bwlimit=8M: the flush is capped" "$el ms"
umount_it

# --- verify=readback -----------------------------------------------------------
mount_with verify "verify=readback,chunk_size=1Mi" || bad "mount verify" "$(cat "$T/err")"
cp "$T/src24" "$M/big"
"$FERRYFS" flush "$M" --wait >/dev/null && cmp -s "$T/src24" "$T/verify/big" &&
	ok "verify=readback: flushed and equal" || bad "verify=readback" "differs"
json=$("$FERRYFS" status "$M" --json)
rd=$(field "$json" remote_bytes_read)
[ "$rd" -ge $((24 << 20)) ] && ok "verify=readback: every chunk read back ($rd bytes)" ||
	bad "verify=readback: every chunk read back" "$json"
umount_it

# --- journal_max ---------------------------------------------------------------
mount_with max "journal_max=4Mi,chunk_size=1Mi,streams=2,remote_stream_rate=16M" ||
	bad "mount journal_max" "$(cat "$T/err")"
if cp "$T/src24" "$M/big"; then
	ok "journal_max=4Mi: a 24 MiB write waits for the flush and succeeds"
else
	bad "journal_max=4Mi: a 24 MiB write succeeds" "cp failed"
fi
json=$("$FERRYFS" status "$M" --json)
[ "$(field "$json" write_waits)" -gt 0 ] && ok "journal_max: status counts the waits" ||
	bad "journal_max: status counts the waits" "$json"
"$FERRYFS" flush "$M" --wait >/dev/null && cmp -s "$T/src24" "$T/max/big" &&
	ok "journal_max: all of it on the share" || bad "journal_max: all of it on the share" "differs"
umount_it

# --- cache_ttl: attributes trusted between opens, an open asks the share ------
if mount_with ttl "cache_ttl=30"; then
	printf aaaa >"$T/ttl/f"
	s1=$(stat -c %s "$M/f")
	printf bbbbbbbb >"$T/ttl/f" # another writer, on the share itself
	s2=$(stat -c %s "$M/f")
	c=$(cat "$M/f")
	s3=$(stat -c %s "$M/f")
	[ "$s1:$s2" = "4:4" ] && ok "cache_ttl=30: a stat within the TTL keeps the cached size ($s1, $s2)" ||
		bad "cache_ttl=30: a stat within the TTL keeps the cached size" "$s1, $s2"
	[ "$c:$s3" = "bbbbbbbb:8" ] && ok "cache_ttl=30: the next open reads the share's new content, and the size follows ($s3)" ||
		bad "cache_ttl=30: the next open sees the change" "'$c', size $s3"
	umount_it
else
	bad "mount with cache_ttl=30" "$(cat "$T/err")"
fi
if mount_with ttl0 "cache_ttl=0"; then
	printf aaaa >"$T/ttl0/f"
	s1=$(stat -c %s "$M/f")
	printf bbbbbbbb >"$T/ttl0/f"
	s2=$(stat -c %s "$M/f")
	[ "$s1:$s2" = "4:8" ] && ok "cache_ttl=0: a stat sees the share's change at once ($s1, $s2)" ||
		bad "cache_ttl=0: a stat sees the share's change at once" "$s1, $s2"
	umount_it
else
	bad "mount with cache_ttl=0" "$(cat "$T/err")"
fi
refused ttl cache_ttl=-1 'cache_ttl must be'

# --- the block cache over a share on a local disk ----------------------------------
# $T is on a local disk: the mount reads such a share directly and makes no
# block cache (it would copy the disk to itself); -o cache_local caches it,
# and so does a throttled share, which stands for a remote one
cache_case() { # cache_case NAME OPTS WANT (on|off)
	local json got
	if ! mount_with "$1" "$2"; then
		bad "mount with '$2'" "$(cat "$T/err")"
		return
	fi
	head -c 3000000 /dev/urandom >"$T/$1/f"
	cmp -s "$T/$1/f" "$M/f" || bad "'$2': a file on the share reads back" "differs"
	json=$("$FERRYFS" status "$M" --json)
	got=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1])["cache"]; print("off" if c is None else "on" if c["share_read_bytes"] + c["readahead_bytes"] >= 3000000 else "idle")' "$json")
	if [ "$3" = off ]; then
		[ "$got" = off ] && [ ! -e "$T/$1.c" ] &&
			"$FERRYFS" status "$M" | grep -q "cache: off: the share is on a local disk" &&
			ok "'$2': a share on a local disk is read directly, no cache made, status says why" ||
			bad "'$2': a local share is not cached" "cache $got, $(ls -d "$T/$1.c" 2>&1); $json"
	else
		[ "$got" = on ] && [ -d "$T/$1.c" ] &&
			ok "'$2': the file came through the block cache" ||
			bad "'$2': the block cache is used" "cache $got; $json"
	fi
	umount_it
}
cache_case lc0 "readahead=4" off
cache_case lc1 "cache_local" on
cache_case lc2 "remote_rate=1G" on

# --- max_read: the kernel's largest read; what is read stays right -------------------
if mount_with mr "max_read=65536"; then
	head -c $((3 << 20)) /dev/urandom >"$T/mr/f"
	a=$(sha256sum <"$T/mr/f")
	b=$(sha256sum <"$M/f")
	c=$(sha256sum <"$M/f") # again: from the block cache
	[ "$a" = "$b" ] && [ "$a" = "$c" ] && ok "max_read=65536: a 3 MiB file reads back the same, cold and cached" ||
		bad "max_read=65536: a 3 MiB file reads back the same" "$a / $b / $c"
	umount_it
else
	bad "mount with max_read=65536" "$(cat "$T/err")"
fi
refused mr max_read=100 'max_read must be'
refused mr max_background=0 'max_background must be'

# --- a journal belongs to one share ------------------------------------------------
mkdir -p "$T/other"
if "$FERRYFS" mount "$T/other" "$M" -o "journal=$T/max.j,cache=off" 2>"$T/err"; then
	bad "a journal over another share is refused" "mounted"
	umount_it
else
	[ "$(wc -l <"$T/err")" = 1 ] && grep -q "$T/max.j" "$T/err" &&
		ok "a journal over another share is refused: $(cat "$T/err")" ||
		bad "a journal over another share: one line naming it" "$(cat "$T/err")"
fi
is_mounted && bad "nothing mounted after the refusal" "mounted" ||
	ok "nothing mounted after the refusal"

# --- a corrupted journal ----------------------------------------------------------
cp -r "$T/verify.j" "$T/bad.j"
f=$(find "$T/bad.j" -name data.mdb | head -1)
dd if=/dev/urandom of="$f" bs=4096 count=4 conv=notrunc status=none
mkdir -p "$T/bad"
if "$FERRYFS" mount "$T/verify" "$M" -o "journal=$T/bad.j,cache=off" 2>"$T/err"; then
	bad "a corrupted journal is refused" "mounted"
	umount_it
else
	rc=$?
	[ "$rc" -lt 128 ] && [ "$(wc -l <"$T/err")" = 1 ] &&
		ok "a corrupted journal: exit $rc, one line: $(cat "$T/err")" ||
		bad "a corrupted journal: one line, no crash" "exit $rc: $(cat "$T/err")"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
