#!/bin/bash
# bench_read.sh - reads through the block cache and read-ahead (issue 5; a
# benchmark, not a test)
#
#   sudo tests/bench/bench_read.sh [--append]
#
# A SIZE_MB (2048) MiB file on the share (a directory under /var/tmp on
# the real disk), read with `dd bs=1M of=/dev/null`; the page cache is
# dropped before every read and PREFAULT_MB MiB of memory written once
# (lib.sh's drop_caches: this VM's first touch of memory its host took
# back costs ~3x); each mount gets a fresh block cache.
#
#   throttled cold   the share behind THROTTLE (remote_stream_rate=110M,
#                    remote_rate=440M: a NAS whose single stream is capped):
#                    -o readahead=4 against the same read with read-ahead
#                    off and one stream (-o readahead=0,max_threads=1: the
#                    FUSE loop fetches one block at a time)
#   cold             unthrottled: through the mount against the share's
#                    file read directly; the share is on a local disk, so
#                    the default mount reads it directly (no block cache),
#                    and a second mount with -o cache_local through a fresh
#                    block cache
#   warm             the same file read again through each mount (the page
#                    cache dropped; with cache_local from the warm block
#                    cache) against a local copy of it read directly
# Medians of RUNS (3), alternating the order; a markdown table; --append
# adds it to tests/bench/RESULTS.md.
#
# Environment: RUNS=3 SIZE_MB=2048 THROTTLE=remote_stream_rate=110M,remote_rate=440M
#   PREFAULT_MB=8192 (0: none)
#   BUILD_DIR=build  FERRYFS=<binary>  BENCH_PARENT=/var/tmp
set -euo pipefail
shopt -s inherit_errexit

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
RUNS=${RUNS:-3}
SIZE_MB=${SIZE_MB:-2048}
THROTTLE=${THROTTLE:-remote_stream_rate=110M,remote_rate=440M}
PREFAULT_MB=${PREFAULT_MB:-8192}
BENCH_PARENT=${BENCH_PARENT:-/var/tmp}
((EUID == 0)) || die "needs root (to drop the page cache): sudo $0"
bench_ferryfs

WORK=$(mktemp -d "$BENCH_PARENT/ferryfs-rbench.XXXXXX")
MNT=$WORK/mnt
PID=
is_mounted() { awk -v m="$MNT" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }
umount_it() {
	if is_mounted; then
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
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	umount_it || true
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$MNT" "$WORK/share" "$WORK/local"
free_mb=$(df -Pm "$WORK" | awk 'NR == 2 { print $4 }')
((free_mb > SIZE_MB * 4 + 500)) || die "need ~$((SIZE_MB * 4)) MB free under $BENCH_PARENT"
log "bench: writing the $SIZE_MB MiB file"
head -c $((SIZE_MB << 20)) /dev/urandom >"$WORK/share/big.bin"
cp "$WORK/share/big.bin" "$WORK/local/big.bin"
sync

read_secs() { # read_secs FILE: seconds of a cold dd of it
	local t0 t1
	drop_caches
	t0=$(now)
	dd if="$1" of=/dev/null bs=1M status=none
	t1=$(now)
	secs "$t0" "$t1"
}
mount_with() { # mount_with OPTS: a fresh cache
	rm -rf "$WORK/cache" "$WORK/journal"
	"$FERRYFS" mount "$WORK/share" "$MNT" -f \
		-o "journal=$WORK/journal,cache=$WORK/cache,$1" >"$WORK/ferryfs.log" 2>&1 &
	PID=$!
	for _ in $(seq 1 100); do
		is_mounted && return 0
		sleep 0.1
	done
	die "mount failed: $(tail -3 "$WORK/ferryfs.log")"
}
declare -A RAW
for k in ra4 ra0 cold_plain cold_cached direct warm_plain warm_cached local; do RAW[$k]=; done
for ((i = 1; i <= RUNS; i++)); do
	if ((i % 2)); then order=(ra4 ra0); else order=(ra0 ra4); fi
	for k in "${order[@]}"; do
		if [[ $k == ra4 ]]; then
			mount_with "$THROTTLE,readahead=4"
		else
			mount_with "$THROTTLE,readahead=0,max_threads=1"
		fi
		t=$(read_secs "$MNT/big.bin")
		umount_it
		RAW[$k]+="$t "
		log "bench: throttled cold $k run $i/$RUNS: ${t}s"
	done
	# the share is on a local disk: the default mount reads it directly
	# (no block cache, RMT_CAP_LOCAL); -o cache_local puts the cache
	# between them, as for a share on the network
	# (the direct read before both mounts on even runs, after on odd ones)
	((i % 2)) || RAW[direct]+="$(read_secs "$WORK/share/big.bin") "
	for v in plain cached; do
		opts=readahead=4
		[[ $v == plain ]] || opts+=,cache_local
		mount_with "$opts"
		RAW[cold_$v]+="$(read_secs "$MNT/big.bin") "
		RAW[warm_$v]+="$(read_secs "$MNT/big.bin") "
		umount_it
	done
	((i % 2 == 0)) || RAW[direct]+="$(read_secs "$WORK/share/big.bin") "
	RAW[local]+="$(read_secs "$WORK/local/big.bin") "
	log "bench: unthrottled run $i/$RUNS: cold ${RAW[cold_plain]}/ cached ${RAW[cold_cached]}/ direct ${RAW[direct]}/ warm ${RAW[warm_plain]}/ cached ${RAW[warm_cached]}/ local ${RAW[local]}"
done

m() { median <<<"${RAW[$1]}"; }
rate() { awk -v s="$1" -v b=$((SIZE_MB << 20)) 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
[[ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1)" ]] && commit+=" + local changes"
table=$(
	cat <<EOF

### Reads: block cache and read-ahead, $(date -u +%Y-%m-%d) ($commit)

\`sudo RUNS=$RUNS SIZE_MB=$SIZE_MB THROTTLE=$THROTTLE PREFAULT_MB=$PREFAULT_MB tests/bench/bench_read.sh\`
(medians of $RUNS, $SIZE_MB MiB, \`dd bs=1M\`, page cache dropped and $PREFAULT_MB MiB prefaulted before every read; share on $(stat -f -c %T "$WORK") under $BENCH_PARENT, $(nproc) CPUs)

| read | ferryfs | baseline | ratio | target |
|---|---|---|---|---|
| throttled cold: readahead=4 vs readahead=0, one stream | $(m ra4) s ($(rate "$(m ra4)") MB/s) | $(m ra0) s ($(rate "$(m ra0)") MB/s) | $(ratio "$(m ra0)" "$(m ra4)")x | >= 3x |
| unthrottled cold: mount (a local share: read directly) vs the share's file directly | $(m cold_plain) s ($(rate "$(m cold_plain)") MB/s) | $(m direct) s ($(rate "$(m direct)") MB/s) | $(ratio "$(m direct)" "$(m cold_plain)") | >= 0.8 |
| unthrottled cold: mount -o cache_local (block cache) vs the same | $(m cold_cached) s ($(rate "$(m cold_cached)") MB/s) | $(m direct) s ($(rate "$(m direct)") MB/s) | $(ratio "$(m direct)" "$(m cold_cached)") | |
| warm re-read: mount (a local share: read directly) vs a local file | $(m warm_plain) s ($(rate "$(m warm_plain)") MB/s) | $(m local) s ($(rate "$(m local)") MB/s) | $(ratio "$(m local)" "$(m warm_plain)") | >= 0.8 |
| warm re-read: mount -o cache_local (block cache) vs a local file | $(m warm_cached) s ($(rate "$(m warm_cached)") MB/s) | $(m local) s ($(rate "$(m local)") MB/s) | $(ratio "$(m local)" "$(m warm_cached)") | |

Raw seconds: ra4 ${RAW[ra4]}| ra0 ${RAW[ra0]}| cold ${RAW[cold_plain]}| cold cache_local ${RAW[cold_cached]}| direct ${RAW[direct]}| warm ${RAW[warm_plain]}| warm cache_local ${RAW[warm_cached]}| local ${RAW[local]}
EOF
)
echo "$table"
if ((APPEND)); then
	echo "$table" >>"$RESULTS"
	log "bench: appended to $RESULTS"
fi
