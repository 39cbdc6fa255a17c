#!/bin/bash
# bench_writeback.sh - write-back against write-through, over the same slow
# share (issue 3; a benchmark, not a test)
#
#   sudo tests/bench/bench_writeback.sh [--append]
#
# The share is a directory on the real disk (under /var/tmp) behind the
# throttle of the path driver, the same for both modes: THROTTLE, default
# remote_rate=110M,remote_latency=1ms (a 1 GbE NAS, 1 ms per operation;
# remote_rate is one link for the whole daemon: the mount and all flush
# streams share it). Each run gets a fresh mount, share and journal, the
# page cache is dropped first, and the two modes alternate their order.
#
#   cp-big   cp SRC MNT/            SRC: SIZE_MB MiB (2048) on tmpfs
#   tar-x    tar xf TAR -C MNT/     TAR: SMALL_FILES (10000) files of
#                                   1-16 KiB in 100 directories, on tmpfs
# write-through (-o writeback=off): the time of the command (the data is on
# the share when it returns). write-back (streams=STREAMS, default 4): the
# time of the command, and then the time `ferryfs flush --wait` takes until
# all of it is on the share (the flush rate of cp-big is SIZE / the time
# from the start of cp to the end of the flush: the flush starts while cp
# runs).
# Every run checks the share's copy (cmp, or diff -r) after the flush.
# Prints medians of RUNS (3) as a markdown table; --append adds it to
# tests/bench/RESULTS.md.
#
# Environment: RUNS=3 SIZE_MB=2048 SMALL_FILES=10000 STREAMS=4
#   THROTTLE=remote_rate=110M,remote_latency=1ms  BUILD_DIR=build
#   FERRYFS=<binary, default $BUILD_DIR/fs/ferryfs>  BENCH_PARENT=/var/tmp
set -euo pipefail
shopt -s inherit_errexit

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
RUNS=${RUNS:-3}
SIZE_MB=${SIZE_MB:-2048}
SMALL_FILES=${SMALL_FILES:-10000}
STREAMS=${STREAMS:-4}
THROTTLE=${THROTTLE:-remote_rate=110M,remote_latency=1ms}
BENCH_PARENT=${BENCH_PARENT:-/var/tmp}

((EUID == 0)) || die "needs root (to drop the page cache): sudo $0"
for t in fusermount3 tar cmp diff awk paste perl; do
	command -v "$t" >/dev/null || die "'$t' not found (run scripts/deps.sh)"
done
bench_ferryfs

WORK=
SHM=
MNT=
PID=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	umount_it || true
	[[ -n "$WORK" ]] && rm -rf "$WORK"
	[[ -n "$SHM" ]] && rm -rf "$SHM"
	return 0
}
is_mounted() {
	awk -v m="$MNT" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo
}
umount_it() {
	if [[ -n "$MNT" ]] && is_mounted; then
		for _ in $(seq 1 20); do
			fusermount3 -u "$MNT" 2>/dev/null && break
			sleep 0.5
		done
		is_mounted && fusermount3 -uz "$MNT"
	fi
	if [[ -n "$PID" ]]; then
		wait "$PID" 2>/dev/null || true
		PID=
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

WORK=$(mktemp -d "$BENCH_PARENT/ferryfs-wbbench.XXXXXX")
SHM=$(mktemp -d /dev/shm/ferryfs-wbbench.XXXXXX)
MNT=$WORK/mnt
mkdir -p "$MNT"
need_mb=$((SIZE_MB * 3 + 500))
free_mb=$(df -Pm "$WORK" | awk 'NR == 2 { print $4 }')
((free_mb > need_mb)) || die "need ~$need_mb MB free under $BENCH_PARENT"

log "bench: making the sources in $SHM"
head -c $((SIZE_MB << 20)) /dev/urandom >"$SHM/big.bin"
make_tree "$SHM/tree" "$SMALL_FILES" 100
tar -C "$SHM/tree" -cf "$SHM/tree.tar" .

drop_caches() { sync && echo 3 >/proc/sys/vm/drop_caches; }

# mount_mode MODE: a fresh share (and journal) mounted in MODE (wt | wb)
mount_mode() {
	rm -rf "$WORK/remote" "$WORK/journal"
	mkdir -p "$WORK/remote"
	local o="$THROTTLE"
	if [[ $1 == wt ]]; then
		o+=",writeback=off,cache=off"
	else
		o+=",journal=$WORK/journal,cache=off,streams=$STREAMS"
	fi
	"$FERRYFS" mount "$WORK/remote" "$MNT" -f -o "$o" >"$WORK/ferryfs.log" 2>&1 &
	PID=$!
	for _ in $(seq 1 100); do
		is_mounted && return 0
		sleep 0.1
	done
	die "mount failed: $(tail -3 "$WORK/ferryfs.log")"
}

# run WORKLOAD MODE: prints "CMD_SECONDS FLUSH_SECONDS"
run() {
	local w=$1 mode=$2 t0 t1 t2
	mount_mode "$mode"
	drop_caches
	t0=$(now)
	case $w in
	cp-big) cp "$SHM/big.bin" "$MNT/" ;;
	tar-x) tar -C "$MNT" -xf "$SHM/tree.tar" ;;
	esac
	t1=$(now)
	if [[ $mode == wb ]]; then
		"$FERRYFS" flush "$MNT" --wait >/dev/null
	fi
	t2=$(now)
	case $w in
	cp-big) cmp "$SHM/big.bin" "$WORK/remote/big.bin" ||
		die "$w $mode: the share's copy differs" ;;
	tar-x) diff -r "$SHM/tree" "$WORK/remote" >/dev/null ||
		die "$w $mode: the share's tree differs" ;;
	esac
	umount_it
	echo "$(secs "$t0" "$t1") $(secs "$t1" "$t2")"
}

declare -A CMD FLUSH
for w in cp-big tar-x; do
	for mode in wt wb; do CMD[$w$mode]= FLUSH[$w$mode]=; done
	for ((i = 1; i <= RUNS; i++)); do
		if ((i % 2)); then order=(wt wb); else order=(wb wt); fi
		for mode in "${order[@]}"; do
			read -r c f < <(run "$w" "$mode")
			CMD[$w$mode]+="$c "
			FLUSH[$w$mode]+="$f "
			log "bench: $w run $i/$RUNS $mode: command ${c}s, flush ${f}s"
		done
	done
done

# --- report ------------------------------------------------------------------
m() { median <<<"$1"; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a / b }'; }
link=$(sed -n 's/.*remote_rate=\([0-9.]*\)M.*/\1/p' <<<"$THROTTLE")
bytes=$((SIZE_MB << 20))
cwt=$(m "${CMD[cp-bigwt]}") cwb=$(m "${CMD[cp-bigwb]}") fwb=$(m "${FLUSH[cp-bigwb]}")
onshare=$(m "$(paste -d+ <(tr ' ' '\n' <<<"${CMD[cp-bigwb]}") <(tr ' ' '\n' <<<"${FLUSH[cp-bigwb]}") | awk -F+ 'NF == 2 && $1 != "" { printf "%.3f ", $1 + $2 }')")
twt=$(m "${CMD[tar-xwt]}") twb=$(m "${CMD[tar-xwb]}") tfl=$(m "${FLUSH[tar-xwb]}")
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
[[ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1)" ]] && commit+=" + local changes"
table=$(
	cat <<EOF

### Write-back vs write-through, $(date -u +%Y-%m-%d) ($commit)

\`sudo RUNS=$RUNS SIZE_MB=$SIZE_MB SMALL_FILES=$SMALL_FILES STREAMS=$STREAMS THROTTLE=$THROTTLE tests/bench/bench_writeback.sh\`
(medians of $RUNS; share on $(stat -f -c %T "$WORK"), sources on tmpfs, $(nproc) CPUs)

| workload | write-through | write-back | speedup | target |
|---|---|---|---|---|
| \`cp\` of a $SIZE_MB MiB file | ${cwt} s ($(rate $bytes "$cwt") MB/s) | ${cwb} s ($(rate $bytes "$cwb") MB/s) | $(ratio "$cwt" "$cwb")x | >= 5x |
| \`tar x\` of $SMALL_FILES files | ${twt} s | ${twb} s | $(ratio "$twt" "$twb")x | >= 10x |
| on the share: start of \`cp\` to the end of \`flush --wait\`, $STREAMS streams | ${cwt} s | ${onshare} s ($(rate $bytes "$onshare") MB/s$([[ -n "$link" ]] && echo ", $(awk -v r="$(rate $bytes "$onshare")" -v l="$link" 'BEGIN { printf "%.2f", r / l }') of the ${link} MB/s link")) | | flush >= 0.9 of the link |
| flush of the $SMALL_FILES files | | ${tfl} s | | |

Raw (command s / flush s): cp wt ${CMD[cp-bigwt]}/ wb ${CMD[cp-bigwb]}/ ${FLUSH[cp-bigwb]}; tar wt ${CMD[tar-xwt]}/ wb ${CMD[tar-xwb]}/ ${FLUSH[tar-xwb]}
EOF
)
echo "$table"
if ((APPEND)); then
	echo "$table" >>"$RESULTS"
	log "bench: appended to $RESULTS"
fi
