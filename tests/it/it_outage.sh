#!/bin/bash
# it_outage.sh - the share fails in the middle of a flush, then comes back
# (issue 3, "Remote outage test"). Run by mount_run.sh (MNT, REMOTE,
# FERRYFS, FERRYFS_T set) with FERRYFS_OPTS naming the fault switch:
#   -o remote_fault=@T@/fault,streams=4,chunk_size=1Mi,remote_stream_rate=8M
# (tests/CMakeLists.txt). While the switch file exists every remote call
# fails with the errno written in it (remote/throttle.c).
#
#   1. files written and flushing (a throttled share: the flush is behind);
#   2. the switch on (EIO), later ETIMEDOUT: writes, creates, renames and
#      removals in a directory made through the mount all keep being
#      accepted at local speed; status shows the errors and retries, no
#      stream stops; flush --wait does not claim it is done;
#   3. the switch off: flush --wait completes, every file is on the share
#      with the SHA-256 of what was written, nothing else is there.
set -u
: "${MNT:?run through tests/it/mount_run.sh}" "${FERRYFS_T:?}"
OUTAGE_SWITCH=$FERRYFS_T/fault
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $1"; }
bad() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $1: $2"; }
W=$(mktemp -d /tmp/ferryfs-outage.XXXXXX) || exit 1
trap 'rm -rf "$W"; rm -f "$OUTAGE_SWITCH"' EXIT
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

mkfiles() { # mkfiles PREFIX COUNT: random files in $W/src, copied into the mount
	local i
	for i in $(seq 1 "$2"); do
		head -c $(((RANDOM % 3000 + 1) * 1024)) /dev/urandom >"$W/src/$1$i"
		cp "$W/src/$1$i" "$MNT/d/$1$i" || return 1
	done
}

mkdir -p "$W/src"
rm -f "$OUTAGE_SWITCH"
mkdir "$MNT/d" && ok "mkdir through the mount" || bad "mkdir" "failed"
mkfiles a 10 && ok "10 files written before the outage" || bad "files before the outage" "cp failed"
sleep 0.5

# --- the share fails ---------------------------------------------------------
echo EIO >"$OUTAGE_SWITCH"
start=$(date +%s%N)
if mkfiles b 10; then
	ok "during the outage (EIO): 10 new files accepted"
else
	bad "during the outage (EIO): new files accepted" "cp failed"
fi
mv "$MNT/d/a1" "$MNT/d/a1-renamed" && mv "$W/src/a1" "$W/src/a1-renamed" &&
	ok "during the outage: rename" || bad "during the outage: rename" "failed"
rm "$MNT/d/a2" && rm "$W/src/a2" && ok "during the outage: unlink" ||
	bad "during the outage: unlink" "failed"
mkdir "$MNT/d/sub" && cp "$W/src/a3" "$MNT/d/sub/x" && cp "$W/src/a3" "$W/src/sub-x" &&
	ok "during the outage: mkdir and a file in it" ||
	bad "during the outage: mkdir and a file in it" "failed"
ms=$((($(date +%s%N) - start) / 1000000))
[ "$ms" -lt 20000 ] && ok "writes did not wait for the share ($ms ms)" ||
	bad "writes did not wait for the share" "$ms ms"
ls "$MNT/d" >/dev/null && ok "ls of the directory during the outage" ||
	bad "ls of the directory during the outage" "failed"
cmp -s "$W/src/b5" "$MNT/d/b5" && ok "a file written during the outage reads back" ||
	bad "a file written during the outage reads back" "differs"
sleep 2
json=$("$FERRYFS" status "$MNT" --json)
errors=$(field "$json" errors)
drained=$(field "$json" drained)
stopped=$(python3 -c 'import json,sys; print(sum(s["state"] == "stopped" for s in json.loads(sys.argv[1])["streams"]))' "$json")
[ "$errors" -gt 0 ] && [ "$drained" = False ] && [ "$stopped" = 0 ] &&
	ok "status: $errors errors, not drained, no stream stopped" ||
	bad "status during the outage" "$json"
st=$(getfattr --absolute-names --only-values -n user.ferryfs.state "$MNT/d/b5" 2>&1)
case $st in dirty | flushing) ok "state of a pending file: $st" ;;
*) bad "state of a pending file: dirty or flushing" "$st" ;; esac
if timeout 3 "$FERRYFS" flush "$MNT" --wait >/dev/null 2>&1; then
	bad "flush --wait does not return while the share fails" "it returned 0"
else
	ok "flush --wait does not return while the share fails"
fi
echo ETIMEDOUT >"$OUTAGE_SWITCH"
mkfiles c 5 && ok "during the outage (ETIMEDOUT): 5 more files accepted" ||
	bad "during the outage (ETIMEDOUT): files accepted" "cp failed"
sleep 1

# --- the share is back -------------------------------------------------------
rm -f "$OUTAGE_SWITCH"
if timeout 300 "$FERRYFS" flush "$MNT" --wait >/dev/null; then
	ok "after the outage: flush --wait completes"
else
	bad "after the outage: flush --wait completes" "$("$FERRYFS" status "$MNT")"
fi
nbad=0
for f in "$W"/src/*; do
	n=$(basename "$f")
	case $n in sub-x) r=$REMOTE/d/sub/x ;; *) r=$REMOTE/d/$n ;; esac
	[ "$(sha256sum <"$f")" = "$(sha256sum <"$r" 2>/dev/null)" ] ||
		{ nbad=$((nbad + 1)); echo "# $n differs on the share"; }
done
[ "$nbad" = 0 ] && ok "every file on the share with its SHA-256" ||
	bad "every file on the share with its SHA-256" "$nbad differ"
n_remote=$(find "$REMOTE/d" -type f | wc -l)
n_src=$(find "$W/src" -type f | wc -l)
[ "$n_remote" = "$n_src" ] && [ ! -e "$REMOTE/d/a2" ] && [ ! -e "$REMOTE/d/a1" ] &&
	ok "nothing else on the share ($n_remote files)" ||
	bad "nothing else on the share" "$n_remote files vs $n_src"
json=$("$FERRYFS" status "$MNT" --json)
[ "$(field "$json" failed_ops)" = 0 ] && ok "no operation given up" ||
	bad "no operation given up" "$json"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
