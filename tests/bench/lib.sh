# lib.sh - what the benchmark scripts of tests/bench share; sourced, not run.
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   bench_args "$@"      --append sets APPEND=1, -h/--help prints the
#                        calling script's header comment; cd to the root,
#                        ROOT and RESULTS set
#   bench_ferryfs        FERRYFS (default $BUILD_DIR/fs/ferryfs) built if
#                        missing, made absolute; warns of a sanitizer build
#   die, log, median     (median: of the numbers on stdin)
#   now, secs T0 T1      nanoseconds now; seconds from T0 to T1 (%.3f)
#   seconds_of CMD...    runs CMD (its stdout must be empty), prints its
#                        seconds
#   cp_a_sync SRC DST    cp -a SRC DST, then sync (the small-file workload)
#   make_tree DIR N D    N files of 1-16 KiB of random bytes in D
#                        directories under DIR (new), the same tree every
#                        time
#   drop_caches          sync, drop the page cache, then write PREFAULT_MB
#                        MiB (unset or 0: none) once in /dev/shm and free
#                        them: this VM's first touch of memory its host
#                        took back costs ~3x, which would fall on whichever
#                        measurement comes first

die() {
	echo "bench: $*" >&2
	exit 1
}
log() { printf '%s\n' "$*" >&2; }

now() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'; }

seconds_of() {
	local t0
	t0=$(now)
	"$@"
	secs "$t0" "$(now)"
}

cp_a_sync() { cp -a "$1" "$2" && sync; }

median() {
	tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 }
		END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

drop_caches() {
	sync && echo 3 >/proc/sys/vm/drop_caches
	if ((${PREFAULT_MB:-0})); then
		dd if=/dev/zero of=/dev/shm/ferryfs-bench-prefault bs=1M \
			count="$PREFAULT_MB" status=none
		rm -f /dev/shm/ferryfs-bench-prefault
	fi
}

bench_args() {
	local script=${BASH_SOURCE[1]}

	cd "$(dirname "$script")/../.."
	ROOT=$(pwd)
	RESULTS=$ROOT/tests/bench/RESULTS.md
	APPEND=0
	case "${1:-}" in
	--append) APPEND=1 ;;
	"") ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "bench: unknown option '$1' (try --help)" >&2
		exit 2
		;;
	esac
}

bench_ferryfs() {
	BUILD_DIR=${BUILD_DIR:-build}
	FERRYFS=${FERRYFS:-$BUILD_DIR/fs/ferryfs}
	if [[ ! -x "$FERRYFS" ]]; then
		log "bench: building $FERRYFS"
		[[ -f "$BUILD_DIR/CMakeCache.txt" ]] ||
			cmake -S "$ROOT" -B "$BUILD_DIR" -DFERRYFS_WERROR=ON >/dev/null
		cmake --build "$BUILD_DIR" --target ferryfs -j"$(nproc)" >/dev/null
	fi
	FERRYFS=$(realpath "$FERRYFS")
	if grep -q 'FERRYFS_SANITIZE:BOOL=ON' "$(dirname "$FERRYFS")/../CMakeCache.txt" 2>/dev/null; then
		log "bench: warning: $FERRYFS is a sanitizer build; numbers will be low"
	fi
}

make_tree() {
	perl -e '
		my ($top, $nfiles, $ndirs) = @ARGV;
		srand(20251129);
		open(my $r, "<", "/dev/urandom") or die "urandom: $!";
		read($r, my $pool, 1 << 20) == 1 << 20 or die "short read";
		mkdir "$top" or die "$top: $!";
		for my $d (0 .. $ndirs - 1) {
			mkdir sprintf("%s/d%03d", $top, $d) or die;
		}
		for my $i (0 .. $nfiles - 1) {
			my $len = 1024 + int(rand(15 * 1024 + 1));
			my $off = int(rand((1 << 20) - $len));
			my $p = sprintf("%s/d%03d/f%05d.dat", $top, $i % $ndirs, $i);
			open(my $o, ">", $p) or die "$p: $!";
			print $o substr($pool, $off, $len);
			close($o) or die "$p: $!";
		}' "$1" "$2" "$3"
}
