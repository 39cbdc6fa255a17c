#!/bin/bash
# ab_read.sh - two ferryfs builds side by side on the unthrottled read of
# bench_read.sh (issue 5; a benchmark, not a test): which one reads
# faster, and with how much of the daemon's CPU.
#
#   sudo tests/bench/ab_read.sh FERRYFS_A FERRYFS_B [--append]
#
# A SIZE_MB (2048) MiB file on the share (a directory under /var/tmp on
# the real disk), `dd bs=1M` through a mount with a fresh block cache
# (cold), then again (warm: the block cache, page cache dropped), and the
# share's file directly; RUNS (5) runs, the order of A and B alternating.
# The CPU figure is the daemon's user+system seconds during the cold read
# (from /proc/PID/stat): on 2 cores shared with dd it decides much of the
# wall time, and it varies less.
#
# Before every read the page cache is dropped and PREFAULT_MB (8192) MiB
# of memory is touched and freed: this VM hands freed pages back to its
# host, and the first touch of such a page costs about 3x (1 GiB of page
# cache written: 1.18 s into returned pages, 0.36 s into recycled ones),
# which otherwise swings a 2 GiB read by a factor of 2 from run to run.
# PREFAULT_MB=0 turns it off.
#
# Environment: RUNS=5 SIZE_MB=2048 PREFAULT_MB=8192 BENCH_PARENT=/var/tmp
#   OPTS=readahead=4 (mount options of both), OPTS_A, OPTS_B (more of A's,
#   of B's: one build against itself with another option, e.g.
#   OPTS_A=max_background=12 ab_read.sh build/fs/ferryfs build/fs/ferryfs)
# The share is on a local disk: since RMT_CAP_LOCAL a build reads it
# directly, without the block cache; OPTS=readahead=4,cache_local measures
# the cache (older builds refuse that option).
set -euo pipefail
shopt -s inherit_errexit

A=${1:-}
B=${2:-}
shift 2 || true
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
[[ -x "$A" && -x "$B" ]] || die "usage: ab_read.sh FERRYFS_A FERRYFS_B [--append]"
A=$(readlink -f "$A")
B=$(readlink -f "$B")
RUNS=${RUNS:-5}
SIZE_MB=${SIZE_MB:-2048}
PREFAULT_MB=${PREFAULT_MB:-8192}
BENCH_PARENT=${BENCH_PARENT:-/var/tmp}
OPTS=${OPTS:-readahead=4}
OPTS_A=${OPTS_A:-}
OPTS_B=${OPTS_B:-}
((EUID == 0)) || die "needs root (to drop the page cache): sudo $0"

WORK=$(mktemp -d "$BENCH_PARENT/ferryfs-abread.XXXXXX")
MNT=$WORK/mnt
PID=
umount_it() {
	if mountpoint -q "$MNT"; then
		fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -uz "$MNT"
	fi
	if [[ -n "$PID" ]]; then
		wait "$PID" 2>/dev/null || true
		PID=
	fi
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	umount_it || true
	rm -f /dev/shm/ferryfs-bench-prefault
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$MNT" "$WORK/share"
log "ab_read: writing the $SIZE_MB MiB file"
head -c $((SIZE_MB << 20)) /dev/urandom >"$WORK/share/big.bin"
sync

read_secs() { # read_secs FILE: seconds of a dd of it
	local t0 t1
	drop_caches
	t0=$(now)
	dd if="$1" of=/dev/null bs=1M status=none
	t1=$(now)
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
mount_it() { # mount_it BINARY EXTRA_OPTS: a fresh cache and journal
	rm -rf "$WORK/cache" "$WORK/journal"
	"$1" mount "$WORK/share" "$MNT" -f \
		-o "journal=$WORK/journal,cache=$WORK/cache,$OPTS${2:+,$2}" >"$WORK/ferryfs.log" 2>&1 &
	PID=$!
	for _ in $(seq 1 100); do
		mountpoint -q "$MNT" && return 0
		sleep 0.1
	done
	die "mount failed: $(tail -3 "$WORK/ferryfs.log")"
}

declare -A COLD WARM CPU
DIRECT=
hz=$(getconf CLK_TCK)
for ((i = 1; i <= RUNS; i++)); do
	if ((i % 2)); then order=(A B); else order=(B A); fi
	for k in "${order[@]}"; do
		bin=$A extra=$OPTS_A
		[[ $k == B ]] && bin=$B extra=$OPTS_B
		mount_it "$bin" "$extra"
		c0=$(cpu_ticks "$PID")
		c=$(read_secs "$MNT/big.bin")
		c1=$(cpu_ticks "$PID")
		w=$(read_secs "$MNT/big.bin")
		umount_it
		COLD[$k]+="$c "
		WARM[$k]+="$w "
		CPU[$k]+="$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN { printf "%.2f", (b - a) / hz }') "
		log "ab_read: run $i/$RUNS $k: cold ${c}s warm ${w}s"
	done
	DIRECT+="$(read_secs "$WORK/share/big.bin") "
done

m() { median <<<"$1"; }
ver() { "$1" --version 2>/dev/null | head -n 1; }
table=$(
	cat <<EOF

### Reads, two builds side by side: $(date -u +%Y-%m-%d\ %H:%M) UTC

\`sudo RUNS=$RUNS SIZE_MB=$SIZE_MB PREFAULT_MB=$PREFAULT_MB OPTS=$OPTS OPTS_A=$OPTS_A OPTS_B=$OPTS_B tests/bench/ab_read.sh A B\`
(medians of $RUNS, $SIZE_MB MiB, \`dd bs=1M\`, page cache dropped and $PREFAULT_MB MiB prefaulted before every read; share on $(stat -f -c %T "$WORK") under $BENCH_PARENT, $(nproc) CPUs)

- A: $A ($(ver "$A"))${OPTS_A:+, -o $OPTS_A}
- B: $B ($(ver "$B"))${OPTS_B:+, -o $OPTS_B}

| build | cold read | daemon CPU, cold | warm re-read | direct read of the share | cold / direct |
|---|---|---|---|---|---|
| A | $(m "${COLD[A]}") s | $(m "${CPU[A]}") s | $(m "${WARM[A]}") s | $(m "$DIRECT") s | $(awk -v a="$(m "$DIRECT")" -v b="$(m "${COLD[A]}")" 'BEGIN { printf "%.2f", a / b }') |
| B | $(m "${COLD[B]}") s | $(m "${CPU[B]}") s | $(m "${WARM[B]}") s | $(m "$DIRECT") s | $(awk -v a="$(m "$DIRECT")" -v b="$(m "${COLD[B]}")" 'BEGIN { printf "%.2f", a / b }') |

Raw: A cold ${COLD[A]}| A cpu ${CPU[A]}| A warm ${WARM[A]}| B cold ${COLD[B]}| B cpu ${CPU[B]}| B warm ${WARM[B]}| direct $DIRECT
EOF
)
echo "$table"
if ((APPEND)); then
	echo "$table" >>"$RESULTS"
	log "ab_read: appended to $RESULTS"
fi
