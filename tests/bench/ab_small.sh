#!/bin/bash
# ab_small.sh - two ferryfs builds side by side on a tree of small files
# copied into a write-back mount (a benchmark, not a test): how long the
# `cp -r` takes and how long until the tree is on the share.
#
#   sudo tests/bench/ab_small.sh FERRYFS_A FERRYFS_B
#
# FILES (10000) files of 1-16 KiB in 100 directories (make_tree) on tmpfs,
# `cp -r` into a mount over a local directory (the path driver,
# unthrottled), then `ferryfs flush --wait`; RUNS (6) runs, the order of
# A and B alternating. PAUSE=1 holds the flush off during the `cp`.
#
# The journal and the cache are on a fresh ext4 on a loop device in
# tmpfs, the share on another (as a NAS is not the journal's disk: a
# sync of the journal's disk does not write the share's files), both made
# anew for every run: on an ext4 where many files were made and deleted
# (this VM's /var/tmp after the tests), creating a file costs ext4 a
# buffer lookup for every free inode its allocator passes
# (recently_deleted()), which took most of a local `cp -r`.
set -euo pipefail
shopt -s inherit_errexit

A=${1:-}
B=${2:-}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ -x "$A" && -x "$B" ]] || die "usage: ab_small.sh FERRYFS_A FERRYFS_B"
A=$(readlink -f "$A")
B=$(readlink -f "$B")
FERRYFS=$A # bench_args warns if it is a sanitizer build
export FERRYFS
bench_args
RUNS=${RUNS:-6}
FILES=${FILES:-10000}
PAUSE=${PAUSE:-0}
((EUID == 0)) || die "needs root (a loop mount): sudo $0"

WORK=$(mktemp -d /dev/shm/ferryfs-absmall.XXXXXX)
FS=$WORK/fs  # the journal's disk; the mount point is $FS/m
SH=$WORK/sh  # the share's
daemon_gone() { # daemon_gone TRIES: waits up to TRIES x 0.1 s for it to exit
	for _ in $(seq 1 "$1"); do
		pgrep -f "ferryfs mount $SH " >/dev/null || return 0
		sleep 0.1
	done
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	if mountpoint -q "$FS/m" 2>/dev/null; then
		fusermount3 -u "$FS/m" 2>/dev/null || fusermount3 -uz "$FS/m"
	fi
	daemon_gone 100
	for d in "$FS" "$SH"; do
		if mountpoint -q "$d" 2>/dev/null; then umount "$d"; fi
	done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
make_tree "$WORK/tree" "$FILES" 100
mkdir -p "$FS" "$SH"

run() { # run FERRYFS: prints "CP_SECS FLUSHED_SECS"
	local f=$1 t0 t1 t2
	for d in "$FS" "$SH"; do
		truncate -s 2G "$d.img"
		mkfs.ext4 -q -F "$d.img"
		mount -o loop "$d.img" "$d"
	done
	mkdir "$FS/m"
	"$f" mount "$SH" "$FS/m" -o "journal=$FS/j,cache=$FS/c"
	if ((PAUSE)); then "$f" pause "$FS/m" >/dev/null; fi
	sync
	t0=$(now)
	cp -r "$WORK/tree" "$FS/m/"
	t1=$(now)
	if ((PAUSE)); then "$f" resume "$FS/m" >/dev/null; fi
	"$f" flush --wait "$FS/m" >/dev/null
	t2=$(now)
	diff -r "$WORK/tree" "$SH/tree" >/dev/null || die "the share's tree differs"
	fusermount3 -u "$FS/m"
	daemon_gone 600
	umount "$FS" "$SH"
	rm -f "$FS.img" "$SH.img"
	echo "$(secs "$t0" "$t1") $(secs "$t0" "$t2")"
}

acp='' aon='' bcp='' bon=''
for i in $(seq 1 "$RUNS"); do
	# the order alternates: the second of a pair was 1.25x slower with
	# the same build on both sides (A before B each time)
	if ((i % 2)); then
		ra=$(run "$A")
		rb=$(run "$B")
	else
		rb=$(run "$B")
		ra=$(run "$A")
	fi
	acp+=" ${ra% *}" aon+=" ${ra#* }"
	bcp+=" ${rb% *}" bon+=" ${rb#* }"
	log "ab_small: run $i: A $ra, B $rb"
done
echo "ab_small: $FILES files, RUNS=$RUNS PAUSE=$PAUSE, medians (cp returns / on the share)"
echo "A $A: $(median <<<"$acp") s / $(median <<<"$aon") s"
echo "B $B: $(median <<<"$bcp") s / $(median <<<"$bon") s"
echo "raw A cp$acp | on the share$aon"
echo "raw B cp$bcp | on the share$bon"
