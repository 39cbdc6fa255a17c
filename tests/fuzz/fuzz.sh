#!/bin/bash
# fuzz.sh - build tests/fuzz/fuzz_agent.c with clang's libFuzzer (ASan and
# UBSan on) and run it from the seed corpus tests/fuzz/corpus_agent/.
#
#   tests/fuzz/fuzz.sh OUT_DIR SECONDS [LIBFUZZER_ARGS...]
#
# OUT_DIR gets the binary, the corpus the run grows (OUT_DIR/corpus; the
# seeds in the source tree are only read) and any crash input
# (OUT_DIR/crash-*). Exits 0 when the run ends without a crash, 1 on a
# crash or a build failure, 77 (skip) when clang is not installed
# (scripts/deps.sh installs clang and libclang-rt-14-dev). Reproduce a
# crash with: OUT_DIR/fuzz_agent OUT_DIR/crash-...
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:?usage: fuzz.sh OUT_DIR SECONDS [ARGS...]}
secs=${2:?usage: fuzz.sh OUT_DIR SECONDS [ARGS...]}
shift 2

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

mkdir -p "$out/corpus"
"$cc" -g -O1 -std=gnu11 -Wall -Wextra -Werror \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	-D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -I"$src/agent" -I"$src/util" \
	"$src/tests/fuzz/fuzz_agent.c" "$src/agent/proto.c" \
	"$src/agent/server.c" -lcrypto -lpthread -o "$out/fuzz_agent"

# the served root and its neighbours: on tmpfs when there is one (the
# agent fdatasync()s every chunk), removed even after a crash
shm=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && shm=/dev/shm
work=$(mktemp -d "$shm/fuzz_agent.XXXXXX")
trap 'chmod -R u+rwx "$work" 2>/dev/null || true; rm -rf "$work" || true' EXIT
export FUZZ_AGENT_TMP=$work

# -close_fd_mask=2: the server logs every connection it ends on stderr;
# libFuzzer and the sanitizers still report there
"$out/fuzz_agent" -max_total_time="$secs" -timeout=60 \
	-rss_limit_mb=4096 -max_len=8192 -close_fd_mask=2 -print_final_stats=1 \
	-artifact_prefix="$out/" "$@" "$out/corpus" "$src/tests/fuzz/corpus_agent"
