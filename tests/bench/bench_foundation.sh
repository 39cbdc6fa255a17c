#!/bin/bash
# bench_foundation.sh — how much does the ferryfs mount cost over the
# directory it mounts? (issue 2; a benchmark, not a test)
#
#   sudo tests/bench/bench_foundation.sh [--append]
#
# Mounts ferryfs over a fresh directory on the real disk (under /var/tmp,
# never tmpfs) and runs each workload into that directory directly and
# through the mount, alternating the order every run, RUNS times each; it
# prints the medians as a markdown table (--append also appends it to
# tests/bench/RESULTS.md). Sources live on tmpfs (/dev/shm). The page cache
# is synced and dropped before every run, then PREFAULT_MB MiB of memory
# written once (lib.sh's drop_caches: this VM's first touch of memory its
# host took back costs ~3x).
#
#   write-dd   dd if=SRC of=TARGET bs=1M conv=fsync      (SIZE_MB MiB)
#   write-cp   cp SRC TARGET && sync TARGET              (SIZE_MB MiB)
#   read-cold  dd if=FILE of=/dev/null bs=1M             (caches dropped)
#   small-cp   cp -a TREE TARGET && sync                 (SMALL_FILES files
#              of 1-16 KiB in SMALL_DIRS dirs)
#
# Environment: RUNS=5 SIZE_MB=1024 SMALL_FILES=10000 SMALL_DIRS=100
#   PREFAULT_MB=8192 (0: none)
#   BUILD_DIR=build  FERRYFS=<binary, default $BUILD_DIR/fs/ferryfs>
#   FERRYFS_OPTS="-o ..." (default "-o writeback=off,cache=off": the
#   foundation, every operation straight through; with the block cache,
#   the mount's read-cold runs after the first would read its cache, and
#   bench_read.sh measures that)
#   BENCH_PARENT=/var/tmp  SHM_PARENT=/dev/shm
# Needs root (drop_caches). Always unmounts and removes its files.
set -euo pipefail
shopt -s inherit_errexit

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
RUNS=${RUNS:-5}
SIZE_MB=${SIZE_MB:-1024}
SMALL_FILES=${SMALL_FILES:-10000}
SMALL_DIRS=${SMALL_DIRS:-100}
PREFAULT_MB=${PREFAULT_MB:-8192}
# the foundation is write-through (issue 2): FERRYFS_OPTS="-o writeback=on"
# measures the write-back mount instead
FERRYFS_OPTS=${FERRYFS_OPTS:--o writeback=off,cache=off}
BENCH_PARENT=${BENCH_PARENT:-/var/tmp}
SHM_PARENT=${SHM_PARENT:-/dev/shm}

((EUID == 0)) || die "needs root (to drop the page cache): sudo $0"
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer"
for t in fusermount3 mountpoint findmnt dd perl awk; do
	command -v "$t" >/dev/null || die "'$t' not found (run scripts/deps.sh)"
done

given=${BUILD_DIR:+BUILD_DIR=$BUILD_DIR }${FERRYFS:+FERRYFS=$FERRYFS }
bench_ferryfs

# --- work space: remote on the real disk, sources on tmpfs --------------------
WORK=
SHM=
PID=
MNT=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$?
	if [[ -n "$MNT" ]] && mountpoint -q "$MNT" 2>/dev/null; then
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			fusermount3 -u "$MNT" 2>/dev/null && break
			sleep 0.5
		done
		mountpoint -q "$MNT" && { fusermount3 -uz "$MNT" || umount -l "$MNT"; }
	fi
	if [[ -n "$PID" ]] && kill -0 "$PID" 2>/dev/null; then
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			kill -0 "$PID" 2>/dev/null || break
			sleep 0.5
		done
		kill "$PID" 2>/dev/null || true
	fi
	if ((rc != 0)) && [[ -s "${WORK:-/nonexistent}/ferryfs.log" ]]; then
		log "--- ferryfs log (tail):"
		tail -n 20 "$WORK/ferryfs.log" >&2
	fi
	[[ -n "$WORK" ]] && rm -rf "$WORK"
	[[ -n "$SHM" ]] && rm -rf "$SHM"
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

WORK=$(mktemp -d "$BENCH_PARENT/ferryfs-bench.XXXXXX")
REMOTE=$WORK/remote
MNT=$WORK/mnt
mkdir -p "$REMOTE" "$MNT"
remote_fs=$(stat -f -c %T "$REMOTE")
case "$remote_fs" in
tmpfs | ramfs) die "$REMOTE is on $remote_fs; set BENCH_PARENT to a directory on a real disk" ;;
esac
SHM=$(mktemp -d "$SHM_PARENT/ferryfs-bench.XXXXXX")
[[ "$(stat -f -c %T "$SHM")" == tmpfs ]] || log "bench: warning: $SHM is not tmpfs"

need_mb=$((SIZE_MB * 3 + RUNS * 2 * SMALL_FILES * 16 / 1000 + 200))
free_mb=$(df -Pm "$REMOTE" | awk 'NR == 2 { print $4 }')
((free_mb > need_mb)) || die "need ~${need_mb} MB free under $BENCH_PARENT, have $free_mb"
shm_free=$(df -Pm "$SHM" | awk 'NR == 2 { print $4 }')
((shm_free > SIZE_MB + SMALL_FILES * 20 / 1000 + 100)) || die "not enough space in $SHM_PARENT"

{ sync && echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null ||
	die "cannot drop the page cache: 'read-cold' would not be cold"

log "bench: sources in $SHM: ${SIZE_MB} MiB file, $SMALL_FILES small files"
head -c "${SIZE_MB}M" /dev/urandom >"$SHM/big.bin"
make_tree "$SHM/tree" "$SMALL_FILES" "$SMALL_DIRS"
BIG_BYTES=$(stat -c %s "$SHM/big.bin")
TREE_BYTES=$(find "$SHM/tree" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')

# the file the cold reads read, written once on the remote directly
dd if="$SHM/big.bin" of="$REMOTE/read.bin" bs=1M conv=fsync status=none

# --- mount -----------------------------------------------------------------------
log "bench: ferryfs mount $REMOTE $MNT -f $FERRYFS_OPTS"
# shellcheck disable=SC2086 # FERRYFS_OPTS is a list of options
"$FERRYFS" mount "$REMOTE" "$MNT" -f -o "journal=$WORK/journal,cache=$WORK/cache" \
	$FERRYFS_OPTS >"$WORK/ferryfs.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
	mountpoint -q "$MNT" && break
	kill -0 "$PID" 2>/dev/null || die "ferryfs exited before mounting: $(tail -n 5 "$WORK/ferryfs.log")"
	sleep 0.1
done
mountpoint -q "$MNT" || die "ferryfs did not mount $MNT in 10 s"
mkdir "$REMOTE/direct" "$MNT/via-mount"
[[ -d "$REMOTE/via-mount" ]] || die "a mkdir through the mount did not reach the remote"

# --- workloads: each prints the seconds it took -----------------------------------

# run_WORKLOAD DIR: DIR is <remote>/direct or <mount>/via-mount
cp_sync() { cp "$1" "$2" && sync "$2"; }
run_write_dd() {
	rm -f "$1/big.bin"
	drop_caches
	seconds_of dd if="$SHM/big.bin" of="$1/big.bin" bs=1M conv=fsync status=none
}
run_write_cp() {
	rm -f "$1/big.bin"
	drop_caches
	seconds_of cp_sync "$SHM/big.bin" "$1/big.bin"
}
run_read_cold() {
	local f=$REMOTE/read.bin
	[[ "$1" == "$MNT"/* ]] && f=$MNT/read.bin
	drop_caches
	seconds_of dd if="$f" of=/dev/null bs=1M status=none
}
# Each run copies to a tree of its own; all are removed after the last run.
# Not before each run: this machine's ext4 has no journal, and ext4 without
# one skips the inodes freed in the last 60 s when it allocates, reading
# their inode table blocks (recently_deleted() in a profile): creates right
# after an rm -rf of 10,000 files took up to twice as long, on both sides.
run_small_cp() {
	drop_caches
	seconds_of cp_a_sync "$SHM/tree" "$1/tree-$i"
}

WORKLOADS=(write-dd write-cp read-cold small-cp)
declare -A RAW_D RAW_M
for w in "${WORKLOADS[@]}"; do
	RAW_D[$w]=
	RAW_M[$w]=
	for ((i = 1; i <= RUNS; i++)); do
		if ((i % 2)); then order=(direct mount); else order=(mount direct); fi
		for side in "${order[@]}"; do
			if [[ $side == direct ]]; then
				t=$("run_${w//-/_}" "$REMOTE/direct")
				RAW_D[$w]+="$t "
			else
				t=$("run_${w//-/_}" "$MNT/via-mount")
				RAW_M[$w]+="$t "
			fi
			log "bench: $w run $i/$RUNS $side: ${t}s"
		done
	done
	rm -rf "$REMOTE/direct/big.bin" "$REMOTE"/direct/tree-* \
		"$MNT/via-mount/big.bin" "$MNT"/via-mount/tree-*
done

# --- report ------------------------------------------------------------------------
cell() { # SECONDS BYTES [FILES]
	awk -v s="$1" -v b="$2" -v n="${3:-0}" 'BEGIN {
		printf "%.2f s (%.0f MB/s", s, b / s / 1e6
		if (n > 0) printf ", %.0f files/s", n / s
		printf ")"
	}'
}
ratio() { awk -v d="$1" -v m="$2" 'BEGIN { printf "%.2f", d / m }'; }

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
[[ -n "$cpu" ]] || cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
[[ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1)" ]] && commit+=" + local changes"
cmdline="${given}RUNS=$RUNS"
((SIZE_MB != 1024)) && cmdline+=" SIZE_MB=$SIZE_MB"
((SMALL_FILES != 10000)) && cmdline+=" SMALL_FILES=$SMALL_FILES"
((SMALL_DIRS != 100)) && cmdline+=" SMALL_DIRS=$SMALL_DIRS"
((PREFAULT_MB != 8192)) && cmdline+=" PREFAULT_MB=$PREFAULT_MB"
[[ -n "$FERRYFS_OPTS" ]] && cmdline+=" FERRYFS_OPTS='$FERRYFS_OPTS'"
cmdline+=" tests/bench/bench_foundation.sh${1:+ $1}"
bdir=$(dirname "$FERRYFS")/..
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$bdir/CMakeCache.txt" 2>/dev/null || true)
build_flags=$(grep -o -- ' -O[0-3sg]' "$bdir/compile_commands.json" 2>/dev/null | head -n 1 || true)
build_desc="${build_type:-default} build${build_flags:+,$build_flags}"
size_label="$((SIZE_MB / 1024)) GiB"
((SIZE_MB % 1024)) && size_label="$SIZE_MB MiB"

report=$(
	echo "## foundation: mount vs direct — $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "- command: \`$cmdline\`"
	echo "- ferryfs: $("$FERRYFS" --version 2>&1 | head -n 1 | sed 's/^ferryfs //') (git $commit, $build_desc), write-through"
	echo "- machine: $cpu, $(nproc) cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM; kernel $(uname -r); Debian $(cat /etc/debian_version 2>/dev/null || echo '?')"
	echo "- remote: $(findmnt -n -o FSTYPE,SOURCE --target "$REMOTE" | tr -s ' ') (under $BENCH_PARENT); sources on tmpfs"
	echo "- runs per side: $RUNS, alternating direct/mount; median; page cache synced and dropped before every run, then $PREFAULT_MB MiB prefaulted"
	echo
	echo "| workload | direct (median) | mount (median) | mount/direct (rate, higher is better) |"
	echo "|---|---|---|---|"
	for w in "${WORKLOADS[@]}"; do
		d=$(median <<<"${RAW_D[$w]}")
		m=$(median <<<"${RAW_M[$w]}")
		case $w in
		write-dd) label="seq write $size_label: \`dd bs=1M conv=fsync\`" b=$BIG_BYTES n=0 ;;
		write-cp) label="seq write $size_label: \`cp\` + \`sync FILE\`" b=$BIG_BYTES n=0 ;;
		read-cold) label="seq read $size_label, cold: \`dd bs=1M\`" b=$BIG_BYTES n=0 ;;
		small-cp) label="\`cp -a\` $SMALL_FILES files (1–16 KiB, $SMALL_DIRS dirs, $((TREE_BYTES / 1000000)) MB) + \`sync\`" b=$TREE_BYTES n=$SMALL_FILES ;;
		esac
		echo "| $label | $(cell "$d" "$b" "$n") | $(cell "$m" "$b" "$n") | $(ratio "$d" "$m") |"
	done
	echo
	echo "Raw seconds (direct | mount):"
	echo
	for w in "${WORKLOADS[@]}"; do
		echo "- $w: ${RAW_D[$w]% } | ${RAW_M[$w]% }"
	done
)

echo
echo "$report"
if ((APPEND)); then
	printf '\n%s\n' "$report" >>"$RESULTS"
	log "bench: appended to $RESULTS"
fi
