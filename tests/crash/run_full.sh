#!/bin/bash
# run_full.sh FERRYFS [FERRY_AGENT] - the full campaign of the crash checker
# (tests/crash/README.md): a bench script, not a ctest test.
#
#   1. the path driver, write-back mount: every known sequence and every
#      workload of 1 op under every crash point kind, then seeded samples
#      of the 2- and 3-op spaces and random 4-8 op sequences, 5,200 pairs
#      (CRASH_FULL_PAIRS) in all;
#   2. the same campaign (another seed) with -o passthrough, 1,500 pairs
#      (CRASH_PT_PAIRS);
#   3. with FERRY_AGENT: 600 pairs (CRASH_AGENT_PAIRS) flushed through a
#      ferry-agent on 127.0.0.1 serving the share, agent_before_sync among
#      the points;
#   4. the nfs driver (--share nfs: nfs-ganesha in network namespaces of
#      its own, NFSv3), write-back mount: the campaign of part 1 with the
#      same seed, so its first 4,800 pairs (CRASH_NFS_PAIRS): 3.48
#      pairs/s against part 1's 3.78 (--max-seconds 90 of each, one after
#      the other, 2026-12-08), so about part 1's time; skipped (77)
#      without nfs-ganesha. CRASH_NFS_PAIRS=0 leaves it out.
# Each part prints its pairs/s and its crash points' hit counts; the build
# needs -DFERRYFS_CRASH_POINTS=ON (scripts/test.sh's build dirs have it).
# Exit 0 if no part found a violation, 1 if one did, 77 if all skipped.
set -u
FERRYFS=${1:?usage: run_full.sh FERRYFS [FERRY_AGENT]}
AGENT=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
SEED=${CRASH_SEED:-36}
rc=0
skips=0
parts=0

part() { # part NAME ARGS...
	local name=$1 r
	shift
	echo "# === $name"
	python3 "$HERE/crashcheck.py" "$FERRYFS" "$@"
	r=$?
	parts=$((parts + 1))
	case $r in
	0) ;;
	77) skips=$((skips + 1)) ;;
	*) rc=1 ;;
	esac
	echo "# === $name: exit $r"
}

part "path driver" --slice full --pairs "${CRASH_FULL_PAIRS:-5200}" \
	--seed "$SEED"
part "passthrough" --slice full --pairs "${CRASH_PT_PAIRS:-1500}" \
	--seed "$((SEED + 1))" --opts passthrough
if [ -n "$AGENT" ]; then
	part "ferry-agent" --slice ci --pairs "${CRASH_AGENT_PAIRS:-600}" \
		--seed "$((SEED + 2))" --agent "$(readlink -f "$AGENT")"
fi
if [ "${CRASH_NFS_PAIRS:-4800}" != 0 ]; then
	part "nfs driver" --slice full --pairs "${CRASH_NFS_PAIRS:-4800}" \
		--seed "$SEED" --share nfs
fi
[ "$skips" = "$parts" ] && exit 77
exit $rc
