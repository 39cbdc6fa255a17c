#!/bin/bash
# fuzz.sh - build one libFuzzer target of tests/fuzz/ with clang (ASan and
# UBSan on) and run it from its seed corpus tests/fuzz/corpus_TARGET/.
#
#   tests/fuzz/fuzz.sh TARGET OUT_DIR SECONDS|-runs=N [LIBFUZZER_ARGS...]
#
# TARGET: agent (agent/ proto + server), journal (journal/rec.c record
# decoders), opts (fs/opts.c, nfs/smb parse_url, throttle/pool options),
# ctl (fs/ctl.c request and reply lines, status JSON), smb (remote/smb.c
# worker protocol, both reading ends). The targets other
# than agent link the modules they do not fuzz from the project's build
# (FERRYFS_BUILD, default ./build: the gcc build of the same tree); only
# the files under test are compiled here, instrumented.
#
# OUT_DIR gets the binary, the corpus the run grows (OUT_DIR/corpus; the
# seeds in the source tree are only read) and any crash input
# (OUT_DIR/crash-*). Exits 0 when the run ends without a crash, 1 on a
# crash or a build failure, 77 (skip) when clang is not installed
# (scripts/deps.sh installs clang and libclang-rt-14-dev). Reproduce a
# crash with: OUT_DIR/fuzz_TARGET OUT_DIR/crash-...
#
# FUZZ_PLANT=1: build with the target's planted off-by-one (-DFUZZ_PLANT=1),
# fuzz from an empty corpus (not the seeds, which may hold the bug) and
# invert the verdict: 0 if the run crashed (the fuzzer found it, the
# seconds it took printed), 1 if it ran out without finding it.
# FUZZ_COVERAGE=1: build with clang's source coverage instead, run every
# seed once (and every input of the directories given as LIBFUZZER_ARGS,
# e.g. the OUT_DIR/corpus a run grew), and print llvm-cov's report of the
# files under test, by file and by function.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=${1:?usage: fuzz.sh TARGET OUT_DIR SECONDS [ARGS...]}
out=${2:?usage: fuzz.sh TARGET OUT_DIR SECONDS [ARGS...]}
secs=${3:?usage: fuzz.sh TARGET OUT_DIR SECONDS [ARGS...]}
shift 3
build=${FERRYFS_BUILD:-$src/build}
plant=${FUZZ_PLANT:-0}
cover=${FUZZ_COVERAGE:-0}

cc=
for c in clang clang-14; do
	if command -v "$c" >/dev/null 2>&1; then
		cc=$c
		break
	fi
done
if [[ -z "$cc" ]]; then
	echo "fuzz.sh: no clang: skipped (scripts/deps.sh installs it)"
	exit 77
fi

# per target: the files compiled here (under test), the libraries of the
# build linked for the rest, and extra flags
incs=(-I"$src/util" -I"$src/agent" -I"$src/remote" -I"$src/journal"
	-I"$src/cache" -I"$src/fs")
libs=()
defs=(-DFERRYFS_FUZZ -DFUZZ_PLANT="$plant")
# as the build's: its libraries' structs and crash points must agree
[[ $target != agent ]] && defs+=(-DFERRYFS_CRASH_POINTS -DFERRYFS_VERSION='"fuzz"')
maxlen=4096
fdmask=2 # the parsers log their refusals on stderr
case $target in
agent)
	files=(agent/proto.c agent/server.c)
	cover_files=(agent/proto.c agent/server.c)
	libs=(-lcrypto -lpthread)
	maxlen=8192
	;;
journal)
	files=(journal/rec.c)
	cover_files=(journal/rec.c)
	;;
opts)
	files=(fs/opts.c remote/nfs.c remote/smb.c remote/throttle.c
		remote/pool.c)
	cover_files=("${files[@]}")
	defs+=(-DFUSE_USE_VERSION=314)
	;;
ctl)
	# main.c for its reply readers; its main() renamed out of the way
	files=(fs/ctl.c fs/status.c fs/main.c)
	cover_files=("${files[@]}")
	defs+=(-Dmain=ferryfs_main)
	fdmask=3 # and main.c's printers write on stdout
	maxlen=16384 # a reply over 8 KiB grows fs_ctl_read_reply()'s buffer
	;;
smb)
	files=(remote/smb.c)
	cover_files=("${files[@]}")
	;;
*)
	echo "fuzz.sh: unknown target '$target'" >&2
	exit 1
	;;
esac
if [[ $target != agent ]]; then
	for a in remote/libremote.a agent/libagent.a util/libutil.a \
		util/libcrash.a util/libnotify.a; do
		if [[ ! -f "$build/$a" ]]; then
			echo "fuzz.sh: no '$build/$a': build the tree first" \
				"(or set FERRYFS_BUILD)" >&2
			exit 1
		fi
	done
	# shellcheck disable=SC2207
	libs=(-Wl,--start-group "$build/fs/libfs.a"
		"$build/journal/libjournal.a" "$build/cache/libcache.a"
		"$build/remote/libremote.a"
		"$build/agent/libagent.a" "$build/util/libutil.a"
		"$build/util/libcrash.a" "$build/util/libnotify.a"
		-Wl,--end-group
		$(pkg-config --libs fuse3 libnfs smbclient jansson lmdb liburing)
		-lcrypto -lpthread)
fi

if [[ $cover == 1 ]]; then
	san=(-fprofile-instr-generate -fcoverage-mapping)
	fuzzer=(-fsanitize=fuzzer)
else
	san=(-fsanitize=fuzzer,address,undefined
		-fno-sanitize-recover=undefined)
	fuzzer=()
fi
# shellcheck disable=SC2207
pkgc=($(pkg-config --cflags fuse3 libnfs smbclient jansson lmdb))
mkdir -p "$out/corpus"
bin=$out/fuzz_$target
"$cc" -g -O1 -std=gnu11 -Wall -Wextra -Werror -Wno-unused-command-line-argument \
	"${san[@]}" "${fuzzer[@]}" -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 \
	"${defs[@]}" \
	"${incs[@]}" "${pkgc[@]}" "$src/tests/fuzz/fuzz_$target.c" \
	"${files[@]/#/$src/}" "${libs[@]}" -o "$bin"

seeds=$src/tests/fuzz/corpus_$target
if [[ $cover == 1 ]]; then
	rm -f "$out"/cov-*.profraw
	LLVM_PROFILE_FILE="$out/cov-%p.profraw" "$bin" -runs=0 \
		-close_fd_mask=3 "$seeds" "$@" >/dev/null 2>&1 || true
	llvm-profdata-14 merge -sparse "$out"/cov-*.profraw -o "$out/cov.profdata"
	llvm-cov-14 report "$bin" -instr-profile="$out/cov.profdata" \
		"${cover_files[@]/#/$src/}"
	# and per function: most of nfs.c and smb.c is no parser
	llvm-cov-14 report --show-functions "$bin" \
		-instr-profile="$out/cov.profdata" "${cover_files[@]/#/$src/}"
	exit 0
fi

if [[ $target == agent ]]; then
	# the served root and its neighbours: on tmpfs when there is one (the
	# agent fdatasync()s every chunk), removed even after a crash
	shm=/tmp
	[[ -d /dev/shm && -w /dev/shm ]] && shm=/dev/shm
	work=$(mktemp -d "$shm/fuzz_agent.XXXXXX")
	trap 'chmod -R u+rwx "$work" 2>/dev/null || true; rm -rf "$work" || true' EXIT
	export FUZZ_AGENT_TMP=$work
fi

if [[ $secs == -runs=* ]]; then
	limit=("$secs")
else
	limit=(-max_total_time="$secs")
fi
# -close_fd_mask: the agent's server logs every connection it ends on
# stderr, ctl's printers write stdout; libFuzzer and the sanitizers still
# report on stderr
# a planted bug is looked for from nothing: the seeds may hold it
dirs=("$out/corpus" "$seeds")
if [[ $plant == 1 ]]; then
	rm -rf "$out/corpus"
	mkdir -p "$out/corpus"
	dirs=("$out/corpus")
fi
start=$(date +%s.%N)
rc=0
"$bin" "${limit[@]}" -timeout=60 -rss_limit_mb=4096 -max_len="$maxlen" \
	-close_fd_mask="$fdmask" -print_final_stats=1 -artifact_prefix="$out/" \
	"$@" "${dirs[@]}" || rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
if [[ $plant == 1 ]]; then
	if [[ $rc != 0 ]] && ls "$out"/crash-* >/dev/null 2>&1; then
		echo "fuzz.sh: planted bug of '$target' found in ${took}s"
		rm -f "$out"/crash-*
		exit 0
	fi
	echo "fuzz.sh: planted bug of '$target' NOT found in ${took}s" >&2
	exit 1
fi
exit "$rc"
