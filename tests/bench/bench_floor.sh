#!/bin/bash
# bench_floor.sh — what FUSE itself costs on this machine: the floor under
# every ferryfs figure that compares a mount with a local disk (issue 2's
# `cp -a`, issue 4's `cp` that returns). A benchmark, not a test.
#
#   sudo tests/bench/bench_floor.sh [--append]
#
# Three sides, each workload RUNS times per side, the order of the sides
# rotated every run, page cache synced and dropped (lib.sh's drop_caches)
# before every run:
#
#   local   a directory on the real disk (under BENCH_PARENT)
#   floor   fuse_floor.c: a FUSE file system that keeps names and
#           attributes in memory and throws the data away, mounted as
#           ferryfs mounts; the kernel sends it the same requests as to
#           ferryfs. No FUSE file system can be faster than this.
#   ferryfs ferryfs over a directory on the same disk, FERRYFS_OPTS
#           (default: none, i.e. write-back into its journal)
#   ferryfs-b  only if FERRYFS_OPTS_B is set: a second ferryfs mount, the
#           same build with those options (its own share and journal), so
#           that two configurations are compared in one run
#
#   cp-big   cp SRC TARGET          (SIZE_MB MiB; the time until cp returns,
#                                    as run.sh's "cp (returns)" rows)
#   read     dd if=FILE of=/dev/null bs=1M  (FILE: the one cp-big wrote in
#                                    the same run, not read before: from
#                                    the disk; the floor's read gives zeros
#                                    from memory: what FUSE alone costs)
#   cp-tree  cp -a TREE TARGET && sync  (SMALL_FILES files of 1-16 KiB in
#                                    100 dirs, as bench_foundation.sh)
#
# Environment: RUNS=5 SIZE_MB=1024 SMALL_FILES=10000 PREFAULT_MB=8192
#   BUILD_DIR=build FERRYFS=<binary> FERRYFS_OPTS="-o ..." FERRYFS_OPTS_B=
#   BENCH_PARENT=/var/tmp SHM_PARENT=/dev/shm
# Needs root (drop_caches) and a C compiler (fuse_floor is built here, as
# nas.sh builds its delay line). Always unmounts and removes its files.
set -euo pipefail
shopt -s inherit_errexit

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
RUNS=${RUNS:-5}
SIZE_MB=${SIZE_MB:-1024}
SMALL_FILES=${SMALL_FILES:-10000}
PREFAULT_MB=${PREFAULT_MB:-8192}
FERRYFS_OPTS=${FERRYFS_OPTS:-}
FERRYFS_OPTS_B=${FERRYFS_OPTS_B:-}
BENCH_PARENT=${BENCH_PARENT:-/var/tmp}
SHM_PARENT=${SHM_PARENT:-/dev/shm}

((EUID == 0)) || die "needs root (to drop the page cache): sudo $0"
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer"
for t in cc pkg-config fusermount3 mountpoint perl awk; do
	command -v "$t" >/dev/null || die "'$t' not found (run scripts/deps.sh)"
done
given=${BUILD_DIR:+BUILD_DIR=$BUILD_DIR }${FERRYFS:+FERRYFS=$FERRYFS }
bench_ferryfs

WORK=
SHM=
declare -A PIDS=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local m
	for m in "${!PIDS[@]}"; do
		mountpoint -q "$m" && { fusermount3 -u "$m" || fusermount3 -uz "$m"; }
		wait "${PIDS[$m]}" 2>/dev/null || true
	done
	[[ -n "$WORK" ]] && rm -rf "$WORK"
	[[ -n "$SHM" ]] && rm -rf "$SHM"
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

WORK=$(mktemp -d "$BENCH_PARENT/ferryfs-floor.XXXXXX")
case "$(stat -f -c %T "$WORK")" in
tmpfs | ramfs) die "$WORK is on tmpfs; set BENCH_PARENT to a directory on a real disk" ;;
esac
SHM=$(mktemp -d "$SHM_PARENT/ferryfs-floor.XXXXXX")
need_mb=$(((SIZE_MB + SMALL_FILES * 16 / 1000) * RUNS * 2 + 500))
free_mb=$(df -Pm "$WORK" | awk 'NR == 2 { print $4 }')
((free_mb > need_mb)) || die "need ~${need_mb} MB free under $BENCH_PARENT, have $free_mb"

FLOOR=$WORK/fuse_floor
# shellcheck disable=SC2046 # pkg-config's output is a list of flags
cc -O2 -Wall -Wextra -Werror -o "$FLOOR" "$ROOT/tests/bench/fuse_floor.c" \
	$(pkg-config --cflags --libs fuse3) || die "cannot build fuse_floor.c"

log "bench: sources in $SHM: ${SIZE_MB} MiB file, $SMALL_FILES small files"
head -c "${SIZE_MB}M" /dev/urandom >"$SHM/big.bin"
make_tree "$SHM/tree" "$SMALL_FILES" 100

mkdir -p "$WORK/local" "$WORK/floor" "$WORK/share" "$WORK/ferryfs" \
	"$WORK/share-b" "$WORK/ferryfs-b"
wait_mount() { # MNT PID LOG
	for _ in $(seq 100); do
		mountpoint -q "$1" && return 0
		kill -0 "$2" 2>/dev/null || die "$(basename "$1") exited before mounting: $(tail -n 3 "$3")"
		sleep 0.1
	done
	die "$1 not mounted in 10 s"
}
"$FLOOR" "$WORK/floor" >"$WORK/floor.log" 2>&1 &
PIDS[$WORK/floor]=$!
wait_mount "$WORK/floor" $! "$WORK/floor.log"
# the kernel's read-ahead on the mount, as ferryfs sets it (set_readahead()
# in fs/ops.c)
echo 8192 >"/sys/class/bdi/$(mountpoint -d "$WORK/floor")/read_ahead_kb"
# shellcheck disable=SC2086 # FERRYFS_OPTS is a list of options
"$FERRYFS" mount "$WORK/share" "$WORK/ferryfs" -f \
	-o "journal=$WORK/journal,cache=$WORK/cache" $FERRYFS_OPTS \
	>"$WORK/ferryfs.log" 2>&1 &
PIDS[$WORK/ferryfs]=$!
wait_mount "$WORK/ferryfs" $! "$WORK/ferryfs.log"
SIDES=(local floor ferryfs)
MOUNTS=("$WORK/ferryfs")
SHARES=("$WORK/share")
if [[ -n "$FERRYFS_OPTS_B" ]]; then
	# shellcheck disable=SC2086 # FERRYFS_OPTS_B is a list of options
	"$FERRYFS" mount "$WORK/share-b" "$WORK/ferryfs-b" -f \
		-o "journal=$WORK/journal-b,cache=$WORK/cache-b" $FERRYFS_OPTS_B \
		>"$WORK/ferryfs-b.log" 2>&1 &
	PIDS[$WORK/ferryfs-b]=$!
	wait_mount "$WORK/ferryfs-b" $! "$WORK/ferryfs-b.log"
	SIDES+=(ferryfs-b)
	MOUNTS+=("$WORK/ferryfs-b")
	SHARES+=("$WORK/share-b")
fi

# before each run: ferryfs's flusher done with the last one (it would take
# CPU and disk from whichever side runs next), then lib.sh's drop_caches
settle() {
	local m
	for m in "${MOUNTS[@]}"; do
		"$FERRYFS" flush "$m" --wait >/dev/null ||
			die "ferryfs flush --wait failed: $(tail -n 3 "$m.log")"
	done
	drop_caches
}
# run_WORKLOAD DIR: prints its seconds; every run writes new names
run_cp_big() { settle && seconds_of cp "$SHM/big.bin" "$1/big-$i.bin"; }
run_read() { settle && seconds_of dd if="$1/big-$i.bin" of=/dev/null bs=1M status=none; }
run_cp_tree() { settle && seconds_of cp_a_sync "$SHM/tree" "$1/tree-$i"; }

WORKLOADS=(cp-big read cp-tree)
declare -A RAW=()
for w in "${WORKLOADS[@]}"; do
	for ((i = 1; i <= RUNS; i++)); do
		for ((k = 0; k < ${#SIDES[@]}; k++)); do
			side=${SIDES[(i + k) % ${#SIDES[@]}]}
			t=$("run_${w//-/_}" "$WORK/$side")
			RAW[$w,$side]+="$t "
			log "bench: $w run $i/$RUNS $side: ${t}s"
		done
	done
	# the local side's files go once read, so that the disk does not
	# fill; the floor keeps nothing, ferryfs's flusher empties its journal
	[[ $w == cp-big ]] || rm -rf "$WORK"/local/*
done
settle
for ((k = 0; k < ${#MOUNTS[@]}; k++)); do
	for ((i = 1; i <= RUNS; i++)); do
		for f in "${MOUNTS[k]}/big-$i.bin" "${SHARES[k]}/big-$i.bin"; do
			cmp -s "$SHM/big.bin" "$f" ||
				die "$f (copied into a ferryfs mount) differs from its source"
		done
	done
done

# --- report -------------------------------------------------------------------
med() { median <<<"${RAW[$1,$2]}"; }
cell() { awk -v s="$1" 'BEGIN { printf "%.3f s", s }'; }
# the side's time as a multiple of the local one, and the rate ratio
rel() { awk -v l="$1" -v s="$2" 'BEGIN { printf "%.2fx the time, %.2f of the rate", s / l, l / s }'; }

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
[[ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1)" ]] && commit+=" + local changes"
cmdline="${given}RUNS=$RUNS"
((SIZE_MB != 1024)) && cmdline+=" SIZE_MB=$SIZE_MB"
((SMALL_FILES != 10000)) && cmdline+=" SMALL_FILES=$SMALL_FILES"
[[ -n "$FERRYFS_OPTS" ]] && cmdline+=" FERRYFS_OPTS='$FERRYFS_OPTS'"
[[ -n "$FERRYFS_OPTS_B" ]] && cmdline+=" FERRYFS_OPTS_B='$FERRYFS_OPTS_B'"
cmdline+=" tests/bench/bench_floor.sh${1:+ $1}"
report=$(
	echo "## floor: local disk, the least FUSE costs, ferryfs — $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo
	echo "- command: \`$cmdline\`"
	echo "- ferryfs: $("$FERRYFS" --version 2>&1 | head -n 1 | sed 's/^ferryfs //') (git $commit), options: ${FERRYFS_OPTS:-none (write-back)}${FERRYFS_OPTS_B:+; ferryfs-b: $FERRYFS_OPTS_B}; floor: tests/bench/fuse_floor.c"
	echo "- machine: $cpu, $(nproc) cores, $(free -g | awk '/^Mem:/ { print $2 }') GiB RAM; kernel $(uname -r); Debian $(cat /etc/debian_version 2>/dev/null || echo '?'); local side and share: $(findmnt -n -o FSTYPE,SOURCE --target "$WORK" | tr -s ' ')"
	echo "- runs per side: $RUNS, order rotated; median; before every run ferryfs's flush finished, the page cache synced and dropped, then $PREFAULT_MB MiB prefaulted"
	echo
	b_head=${FERRYFS_OPTS_B:+ ferryfs $FERRYFS_OPTS_B |}
	echo "| workload | local | floor (FUSE, data thrown away) | ferryfs |$b_head"
	echo "|---|---|---|---|${FERRYFS_OPTS_B:+---|}"
	for w in "${WORKLOADS[@]}"; do
		l=$(med "$w" local)
		f=$(med "$w" floor)
		m=$(med "$w" ferryfs)
		case $w in
		cp-big) label="\`cp\` of $SIZE_MB MiB, until it returns" ;;
		read) label="\`dd\` read of $SIZE_MB MiB, cold" ;;
		cp-tree) label="\`cp -a\` $SMALL_FILES files + \`sync\`" ;;
		esac
		b=
		if [[ -n "$FERRYFS_OPTS_B" ]]; then
			mb=$(med "$w" ferryfs-b)
			b=" $(cell "$mb") ($(rel "$l" "$mb")) |"
		fi
		echo "| $label | $(cell "$l") | $(cell "$f") ($(rel "$l" "$f")) | $(cell "$m") ($(rel "$l" "$m")) |$b"
	done
	echo
	echo "Raw seconds (local | floor | ferryfs${FERRYFS_OPTS_B:+ | ferryfs-b}):"
	echo
	for w in "${WORKLOADS[@]}"; do
		echo "- $w: ${RAW[$w,local]}| ${RAW[$w,floor]}| ${RAW[$w,ferryfs]}${FERRYFS_OPTS_B:+| ${RAW[$w,ferryfs-b]:-}}"
	done
)
printf '%s\n' "$report"
if ((APPEND)); then
	printf '\n\n%s\n' "$report" >>"$RESULTS"
	log "bench: appended to $RESULTS"
fi
