#!/bin/bash
# it_cache.sh - reads through the block cache and read-ahead (issue 5). Run
# by mount_run.sh (MNT, REMOTE, FERRYFS set; the cache is $FERRYFS_T/cache).
#
#   1. a file put on the share behind the mount reads back right, cold; a
#      sequential reader gets it by read-ahead, not block by block;
#   2. read again (the page cache dropped): served by the cache, nothing
#      more read from the share;
#   3. changed on the share: the next open reads the new content;
#   4. random 4 KiB reads: the share gives no more than 2x the bytes read;
#   5. a file written through the mount (write-back) reads back right.
set -u
: "${MNT:?run through tests/it/mount_run.sh}"
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $1"; }
bad() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $1: $2"; }
cachef() { # cachef KEY: a field of status --json's "cache"
	"$FERRYFS" status "$MNT" --json |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["cache"][sys.argv[1]])' "$1"
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
settle() { # read-ahead a reader outran may still be fetching: wait for it
	local i
	for i in $(seq 300); do
		[ "$(cachef readahead_pending)" = 0 ] && return 0
		sleep 0.1
	done
	echo "# read-ahead still busy after 30 s"
}

head -c $((48 << 20)) /dev/urandom >"$REMOTE/big"
drop
cmp -s "$REMOTE/big" "$MNT/big" && ok "cold read: equal to the share's file" ||
	bad "cold read: equal to the share's file" "differs"
settle
ra=$(cachef readahead_bytes)
direct=$(cachef share_read_bytes)
[ "$ra" -ge $((32 << 20)) ] && ok "cold sequential read: $ra bytes by read-ahead, $direct directly" ||
	bad "cold sequential read: mostly by read-ahead" "read-ahead $ra, direct $direct"

hits=$(cachef hits)
drop
cmp -s "$REMOTE/big" "$MNT/big" && ok "warm read: equal" || bad "warm read: equal" "differs"
[ "$(cachef readahead_bytes)" = "$ra" ] && [ "$(cachef share_read_bytes)" = "$direct" ] &&
	[ "$(cachef hits)" -gt "$hits" ] &&
	ok "warm read: served by the cache, nothing more from the share" ||
	bad "warm read: served by the cache" "$("$FERRYFS" status "$MNT" --json)"

head -c $((48 << 20)) /dev/urandom >"$REMOTE/big"
touch -d '2001-01-01' "$REMOTE/big"
cmp -s "$REMOTE/big" "$MNT/big" && ok "changed on the share: the next open reads the new content" ||
	bad "changed on the share: the next open reads the new content" "old content"

head -c $((64 << 20)) /dev/urandom >"$REMOTE/rand"
drop
settle
before=$(($(cachef share_read_bytes) + $(cachef readahead_bytes)))
read_bytes=$(python3 - "$MNT/rand" "$REMOTE/rand" <<'EOF'
import os, random, sys
random.seed(3)
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
ref = open(sys.argv[2], "rb")
n = 0
for _ in range(300):
    off = random.randrange(1, (64 << 20) // 4096) * 4096
    b = os.pread(fd, 4096, off)
    ref.seek(off)
    if b != ref.read(4096):
        print("MISMATCH", off)
        sys.exit(1)
    n += len(b)
print(n)
EOF
)
settle
after=$(($(cachef share_read_bytes) + $(cachef readahead_bytes)))
fetched=$((after - before))
if [ -n "$read_bytes" ] && [ "$fetched" -le $((2 * read_bytes)) ]; then
	ok "random 4 KiB reads: $fetched bytes from the share for $read_bytes read (<= 2x)"
else
	bad "random 4 KiB reads: <= 2x from the share" "$fetched for ${read_bytes:-error}"
fi

head -c $((8 << 20)) /dev/urandom >"$FERRYFS_T/w"
cp "$FERRYFS_T/w" "$MNT/w"
drop
cmp -s "$FERRYFS_T/w" "$MNT/w" && ok "a file written through the mount reads back" ||
	bad "a file written through the mount reads back" "differs"
"$FERRYFS" flush "$MNT" --wait >/dev/null
drop
cmp -s "$FERRYFS_T/w" "$MNT/w" && ok "and after its flush" || bad "and after its flush" "differs"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
