#!/bin/bash
# it_backlog.sh FERRYFS [FILES] - a mount over a journal holding FILES
# (default 100,000) pending files is usable within 2 seconds (issue 3, "Big
# backlogs"). As root, registered with ctest (label "mount").
#
# 1. mount, `ferryfs pause`, create FILES small files in 100 directories
#    (they stay in the journal), unmount: the journal keeps them, and
#    the daemon exits within 5 s;
# 2. mount again (daemonized, as a user would) and time: the mount command
#    returning, `ls` of the root, `stat` of one pending file, and creating
#    a new file; all of it within 2 s;
# 3. the flush works through the backlog meanwhile: pending operations go
#    down within a few seconds.
set -u
FERRYFS=${1:?usage: it_backlog.sh FERRYFS [FILES]}
FILES=${2:-100000}
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "it_backlog: skip: needs root and /dev/fuse"
	exit 77
fi
FERRYFS=$(readlink -f "$FERRYFS")
T=$(mktemp -d /var/tmp/ferryfs-backlog.XXXXXX) || exit 1
R=$T/remote M=$T/mnt
mkdir -p "$R" "$M"
OPTS="-o journal=$T/journal,cache=$T/cache"
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $1"; }
bad() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $1: $2"; }
is_mounted() { awk -v m="$M" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }
cleanup() {
	is_mounted && { fusermount3 -u "$M" || fusermount3 -uz "$M"; }
	for _ in $(seq 1 50); do pgrep -f "ferryfs mount $R " >/dev/null || break; sleep 0.2; done
	rm -rf "$T"
}
trap cleanup EXIT
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

"$FERRYFS" mount "$R" "$M" $OPTS || { bad "first mount" "failed"; exit 1; }
"$FERRYFS" pause "$M" >/dev/null
start=$(date +%s)
python3 - "$M" "$FILES" <<'EOF'
import os, sys
m, n = sys.argv[1], int(sys.argv[2])
for d in range(100):
    os.mkdir(f"{m}/d{d:02d}")
for i in range(n):
    fd = os.open(f"{m}/d{i % 100:02d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"x")
    os.close(fd)
EOF
echo "# $FILES files created in $(($(date +%s) - start)) s"
json=$("$FERRYFS" status "$M" --json)
ops=$(field "$json" pending_ops)
[ "$ops" -ge "$FILES" ] && ok "$FILES files pending in the journal ($ops ops)" ||
	bad "$FILES files pending in the journal" "$json"
# the daemon's last commit syncs the staging files of what is pending
# (one syncfs, not an fdatasync each: 100,000 of those took 27 s)
t0=$(date +%s%N)
fusermount3 -u "$M"
for _ in $(seq 1 600); do pgrep -f "ferryfs mount $R " >/dev/null || break; sleep 0.1; done
ms_exit=$((($(date +%s%N) - t0) / 1000000))
[ "$ms_exit" -le 5000 ] && ok "the daemon is gone $ms_exit ms after the unmount (<= 5000)" ||
	bad "the daemon is gone within 5 s of the unmount" "$ms_exit ms"

t0=$(date +%s%N)
"$FERRYFS" mount "$R" "$M" $OPTS
rc=$?
t1=$(date +%s%N)
ls "$M" >/dev/null && stat "$M/d07/f7" >/dev/null && echo new >"$M/d07/new" &&
	[ "$(cat "$M/d07/f7")" = x ]
rc2=$?
t2=$(date +%s%N)
ms_mount=$(((t1 - t0) / 1000000))
ms_all=$(((t2 - t0) / 1000000))
[ "$rc" = 0 ] && [ "$rc2" = 0 ] && [ "$ms_all" -le 2000 ] &&
	ok "remount over the backlog usable in $ms_all ms (mount $ms_mount ms) <= 2000" ||
	bad "remount over the backlog usable within 2 s" "rc $rc/$rc2, $ms_all ms"
ls "$M/d42" | wc -l | grep -qx "$((FILES / 100))" &&
	ok "a directory lists its $((FILES / 100)) pending files" ||
	bad "a directory lists its pending files" "$(ls "$M/d42" | wc -l)"
sleep 3
json=$("$FERRYFS" status "$M" --json)
ops2=$(field "$json" pending_ops)
[ "$ops2" -lt "$ops" ] && ok "the flush works through the backlog ($ops -> $ops2 ops in 3 s)" ||
	bad "the flush works through the backlog" "$ops -> $ops2"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
