#!/bin/bash
# test.sh — THE test command of ferryfs (see README.md): run as root,
#   ./scripts/test.sh         (as root; sudo ./scripts/test.sh from a user)
#
# 1. installs the Debian packages it needs (scripts/deps.sh);
# 2. builds in build/ with -Werror and runs the whole ctest suite;
# 3. builds in build-asan/ with ASan+UBSan and runs the whole suite again
#    (skipped with --quick);
# 4. fails if any test failed, or if any test was skipped where nothing
#    was missing: as root with a usable /dev/fuse, or under CI=true,
#    a skip (exit 77) counts as a failure;
# 5. ends with one line "N passed, M failed" covering both passes.
#
# Options:
#   --quick     only the -Werror pass (no sanitizer pass)
#   --no-deps   do not run scripts/deps.sh
#   -- ARGS     pass ARGS to ctest (e.g. -- -L unit, -- -R it_cli)
# Environment:
#   BUILD_DIR=build  ASAN_BUILD_DIR=build-asan (or $BUILD_DIR-asan when
#   BUILD_DIR is set)  FERRYFS_TEST_JOBS=<ctest -j, default: nproc>
#   FERRYFS_ALLOW_SKIP=1  accept skips even as root / in CI (not for CI)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=0
deps=1
ctest_args=()
while (($#)); do
	case "$1" in
	--quick) quick=1 ;;
	--no-deps) deps=0 ;;
	--)
		shift
		ctest_args=("$@")
		break
		;;
	-h | --help)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "test.sh: unknown option '$1' (try --help)" >&2
		exit 2
		;;
	esac
	shift
done

BUILD_DIR=${BUILD_DIR:-build}
if [[ -z "${ASAN_BUILD_DIR:-}" ]]; then
	if [[ "$BUILD_DIR" == build ]]; then
		ASAN_BUILD_DIR=build-asan
	else
		ASAN_BUILD_DIR=${BUILD_DIR%/}-asan
	fi
fi
JOBS=${FERRYFS_TEST_JOBS:-$(nproc)}

say() { printf '\n=== %s\n' "$*"; }

# --- 1. dependencies ------------------------------------------------------
if ((deps)); then
	say "dependencies"
	"$ROOT/scripts/deps.sh" --test
fi

# --- is a skip acceptable? -------------------------------------------------
have_root=0
((EUID == 0)) && have_root=1
if ((have_root)) && [[ ! -e /dev/fuse ]] && command -v modprobe >/dev/null; then
	modprobe fuse 2>/dev/null || true
fi
have_fuse=0
if [[ -c /dev/fuse ]] && (exec 3<>/dev/fuse) 2>/dev/null; then
	have_fuse=1
fi
strict=0
why_strict=
if ((have_root && have_fuse)); then
	strict=1
	why_strict="running as root with a usable /dev/fuse"
elif [[ "${CI:-}" == true ]]; then
	strict=1
	why_strict="CI=true (root: $have_root, usable /dev/fuse: $have_fuse)"
fi
if [[ "${FERRYFS_ALLOW_SKIP:-0}" == 1 ]]; then
	strict=0
	echo "test.sh: FERRYFS_ALLOW_SKIP=1: skipped tests will not fail the run"
fi
if ((!have_fuse)); then
	echo "test.sh: warning: /dev/fuse missing or not usable: mount tests will skip"
fi

# --- sanitizer environment -------------------------------------------------
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
pass_env=()
restore_rnd_bits=

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	if [[ -n "$restore_rnd_bits" ]]; then
		echo "$restore_rnd_bits" >/proc/sys/vm/mmap_rnd_bits 2>/dev/null || true
	fi
	[[ -n "${probe_dir:-}" ]] && rm -rf "$probe_dir"
	return 0
}
trap cleanup EXIT

# Check that ASan/LSan work on this machine before blaming our code:
# LeakSanitizer needs ptrace (absent in some containers), and GCC 12's ASan
# crashes at start on kernels with vm.mmap_rnd_bits > 28.
run_probe() {
	env ASAN_OPTIONS="$ASAN_OPTIONS" UBSAN_OPTIONS="$UBSAN_OPTIONS" \
		"$probe_dir/p" 2>&1
}

probe_sanitizers() {
	probe_dir=$(mktemp -d /tmp/ferryfs-asan-probe.XXXXXX)
	printf '#include <stdlib.h>\nint main(void){void *p=malloc(8);free(p);return 0;}\n' \
		>"$probe_dir/p.c"
	if ! cc -fsanitize=address,undefined -o "$probe_dir/p" "$probe_dir/p.c" 2>"$probe_dir/cc.err"; then
		cat "$probe_dir/cc.err" >&2
		echo "test.sh: cannot build with -fsanitize=address,undefined" >&2
		return 1
	fi
	local out
	if out=$(run_probe); then
		return 0
	fi
	local bits
	bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)
	if ((bits > 28 && have_root)); then
		echo "test.sh: ASan fails with vm.mmap_rnd_bits=$bits; setting it to 28 for this run"
		restore_rnd_bits=$bits
		echo 28 >/proc/sys/vm/mmap_rnd_bits
		out=$(run_probe) && return 0
	fi
	if grep -q 'LeakSanitizer' <<<"$out"; then
		echo "test.sh: warning: LeakSanitizer does not work here (no ptrace?); running with detect_leaks=0"
		ASAN_OPTIONS=${ASAN_OPTIONS//detect_leaks=1/detect_leaks=0}
		out=$(run_probe) && return 0
	fi
	printf '%s\n' "$out" >&2
	echo "test.sh: AddressSanitizer does not run on this machine" >&2
	return 1
}

# --- one pass: configure, build, ctest, count -----------------------------
total_pass=0
total_fail=0
total_skip=0
summaries=()
failed_any=0

# classify JUNIT: prints "status<TAB>name<TAB>message" per test case
classify() {
	awk '
	function attr(s, a,   r) {
		if (match(s, a "=\"[^\"]*\"")) {
			r = substr(s, RSTART + length(a) + 2, RLENGTH - length(a) - 3)
			return r
		}
		return ""
	}
	/<testcase / { name = attr($0, "name"); st = attr($0, "status"); msg = ""; next }
	/<skipped / { msg = attr($0, "message"); next }
	/<\/testcase>/ {
		if (st == "run") c = "passed"
		else if (st == "disabled") { c = "skipped"; msg = "disabled" }
		else if (st == "notrun" && msg ~ /SKIP_RETURN_CODE|SKIP_REGULAR_EXPRESSION/) c = "skipped"
		else if (st == "notrun") c = "failed"
		else c = "failed"
		printf "%s\t%s\t%s\n", c, name, msg
	}' "$1"
}

# junit_output NAME JUNIT: what test NAME printed (from the JUnit file),
# its first 30 lines; junit_output_all: all of it
junit_output() {
	junit_output_all "$@" | head -n 30 || true
}
junit_output_all() {
	awk -v n="$1" '
	/<testcase / { on = index($0, "name=\"" n "\"") > 0; next }
	on && /<system-out>/ { grab = 1; sub(/.*<system-out>/, "") }
	on && grab {
		done = sub(/<\/system-out>.*/, "")
		gsub(/&lt;/, "<"); gsub(/&gt;/, ">"); gsub(/&quot;/, "\""); gsub(/&apos;/, "\047"); gsub(/&amp;/, "\\&")
		if (length($0)) print "    | " $0
		if (done) exit
	}' "$2" 2>/dev/null || true
}

# failure_lines NAME JUNIT: the lines of test NAME's output that say what
# failed (TAP "not ok", cmocka's FAILED/ERROR/LINE lines, "error:"), with
# the lines around each, so the summary at the end of a long log shows them
failure_lines() {
	junit_output_all "$1" "$2" |
		grep -B1 -A1 -E '^    \| (not ok|\[  (FAILED|ERROR) +\]|\[ +LINE +\]|.*(error|FAIL|[Aa]ssert)[^a-z])' |
		grep -v '^--$' | head -n 20 || true
}

# subtest_skips JUNIT: "test: line" for each sub-test a test reported as
# skipped in its own output (TAP "# SKIP", cmocka "[  SKIPPED ]")
subtest_skips() {
	awk '
	/<testcase / { match($0, /name="[^"]*"/); n = substr($0, RSTART + 6, RLENGTH - 7) }
	/^(.*<system-out>)?(not )?ok [0-9]+.*# *(SKIP|skip)/ || /\[  SKIPPED \]/ {
		sub(/.*<system-out>/, ""); print n ": " $0
	}' "$1" 2>/dev/null || true
}

# ctest_status NAME LOG: the "***Timeout"-style status ctest printed for NAME
ctest_status() {
	awk -v n="$1" 'index($0, ": " n " ") && /\*\*\*/ {
		sub(/.*\*\*\*/, ""); sub(/ +[0-9.]+ sec$/, ""); print; exit
	}' "$2" 2>/dev/null || true
}

# run_pass LABEL DIR CMAKE_ARGS...
run_pass() {
	local label=$1 dir=$2
	shift 2
	local t0=$SECONDS
	say "$label: configure + build in $dir"
	# the test builds compile in the named crash points of tests/crash
	# (util/crash.h); a plain cmake build and the packages have none
	if ! cmake -S "$ROOT" -B "$dir" -DFERRYFS_WERROR=ON -DBUILD_TESTING=ON \
		-DFERRYFS_CRASH_POINTS=ON "$@" ||
		! cmake --build "$dir" -j"$(nproc)"; then
		echo "test.sh: $label: BUILD FAILED" >&2
		summaries+=("$label: build failed")
		total_fail=$((total_fail + 1))
		failed_any=1
		return 1
	fi

	say "$label: ctest (-j$JOBS)"
	local junit="$ROOT/$dir/ctest-junit.xml"
	[[ "$dir" == /* ]] && junit="$dir/ctest-junit.xml"
	rm -f "$junit"
	local rc=0
	env "${pass_env[@]}" ctest --test-dir "$dir" --output-on-failure --no-tests=error \
		-j"$JOBS" --output-junit "$junit" "${ctest_args[@]}" \
		</dev/null 2>&1 | tee "$dir/ctest.log" || rc=${PIPESTATUS[0]}

	local p=0 f=0 s=0 results=""
	local -a skipped=() skipped_names=() failed=()
	if [[ -s "$junit" ]]; then
		results=$(classify "$junit")
	fi
	local c name msg
	while IFS=$'\t' read -r c name msg; do
		case "$c" in
		passed) p=$((p + 1)) ;;
		skipped)
			s=$((s + 1))
			skipped+=("$name ($msg)")
			skipped_names+=("$name")
			;;
		*)
			f=$((f + 1))
			[[ -n "$msg" ]] || msg=$(ctest_status "$name" "$dir/ctest.log")
			failed+=("$name${msg:+ ($msg)}")
			;;
		esac
	done <<<"$results"

	if ((p + f + s == 0)); then
		echo "test.sh: $label: no test ran (ctest exit $rc)" >&2
		f=1
		failed+=("(no test ran)")
	elif ((rc != 0 && f == 0)); then
		echo "test.sh: $label: ctest exited $rc with no failed test: counting it as a failure" >&2
		f=1
		failed+=("(ctest exit $rc)")
	fi

	local k
	if ((s > 0 && strict)); then
		echo >&2
		echo "test.sh: $label: FAIL: $s test(s) skipped although $why_strict:" >&2
		for k in "${!skipped[@]}"; do
			echo "  ${skipped[k]}:" >&2
			junit_output "${skipped_names[k]}" "$junit" >&2
		done
		echo "  A skip (exit 77) is only allowed where a prerequisite is truly missing." >&2
		echo "  Full output: $dir/Testing/Temporary/LastTest.log" >&2
		f=$((f + s))
		failed+=("${skipped[@]}")
		s=0
	fi

	local subskips=""
	[[ -s "$junit" ]] && subskips=$(subtest_skips "$junit")

	total_pass=$((total_pass + p))
	total_fail=$((total_fail + f))
	total_skip=$((total_skip + s))
	local line="$label: $p passed, $f failed"
	((s)) && line+=", $s skipped"
	line+=" ($((SECONDS - t0))s)"
	((f)) && line+=" — failed: $(printf '%s, ' "${failed[@]}" | sed 's/, $//')"
	summaries+=("$line")
	if [[ -n "$subskips" ]]; then
		summaries+=("  note: sub-tests skipped inside tests (check that each skip is legitimate):")
		while IFS= read -r k; do summaries+=("    $k"); done <<<"$subskips"
	fi
	((f == 0)) || failed_any=1
	local fl
	for k in "${failed[@]}"; do
		[[ -s "$junit" ]] || break
		fl=$(failure_lines "${k%% (*}" "$junit")
		[[ -n "$fl" ]] || continue
		summaries+=("  ${k%% (*} said:")
		while IFS= read -r k; do summaries+=("  $k"); done <<<"$fl"
	done

	local stale
	stale=$(findmnt -rn -t fuse.ferryfs -o TARGET 2>/dev/null || true)
	if [[ -n "$stale" ]]; then
		echo "test.sh: warning: ferryfs mounts left behind after $label:" >&2
		printf '  %s\n' "$stale" >&2
	fi
	return 0
}

t_start=$SECONDS
build_ok=1
run_pass "pass 1 (-Werror)" "$BUILD_DIR" -DFERRYFS_SANITIZE=OFF || build_ok=0

if ((quick)); then
	summaries+=("pass 2 (ASan+UBSan): not run (--quick)")
elif ((!build_ok)); then
	summaries+=("pass 2 (ASan+UBSan): not run (pass 1 did not build)")
elif probe_sanitizers; then
	echo "ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS"
	pass_env=(ASAN_OPTIONS="$ASAN_OPTIONS" UBSAN_OPTIONS="$UBSAN_OPTIONS")
	run_pass "pass 2 (ASan+UBSan)" "$ASAN_BUILD_DIR" -DFERRYFS_SANITIZE=ON || true
else
	summaries+=("pass 2 (ASan+UBSan): sanitizers unusable on this machine")
	total_fail=$((total_fail + 1))
	failed_any=1
fi

say "summary ($((SECONDS - t_start))s)"
printf '%s\n' "${summaries[@]}"
if ((failed_any)); then
	echo "RESULT: FAILED"
else
	echo "RESULT: OK"
fi
if ((total_skip)); then
	echo "$total_pass passed, $total_fail failed, $total_skip skipped"
else
	echo "$total_pass passed, $total_fail failed"
fi
exit "$failed_any"
