#!/bin/bash
# it_ctl.sh — the control socket and per-file state of a mount (run by
# mount_run.sh: MNT, REMOTE, FERRYFS set): ferryfs status/flush/pause/resume
# and the user.ferryfs.state xattr.
set -u
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $1"; }
bad() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $1: $2"; }
check() { # check NAME CMD...: CMD succeeds
	local name=$1
	shift
	if out=$("$@" 2>&1); then ok "$name"; else bad "$name" "$out"; fi
}
refuse() { # refuse NAME CMD...: CMD fails
	local name=$1
	shift
	if out=$("$@" 2>&1); then bad "$name" "succeeded: $out"; else ok "$name"; fi
}

echo hello >"$MNT/f"

check "status MOUNTPOINT" "$FERRYFS" status "$MNT"
out=$("$FERRYFS" status "$MNT" 2>&1)
grep -q "write-through" <<<"$out" && ok "status names the mode" || bad "status names the mode" "$out"
grep -q "path:$(readlink -f "$REMOTE")" <<<"$out" && ok "status names the remote" ||
	bad "status names the remote" "$out"

json=$("$FERRYFS" status "$MNT" --json 2>&1)
if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["ok"] and d["pending_bytes"] == 0 and "remote_bytes_written" in d' "$json" 2>/dev/null; then
	ok "status --json is JSON with the counters"
else
	bad "status --json is JSON with the counters" "$json"
fi
written=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["remote_bytes_written"])' "$json" 2>/dev/null)
[ "${written:-0}" -ge 6 ] && ok "remote bytes written are counted" ||
	bad "remote bytes written are counted" "$written"

out=$("$FERRYFS" status 2>&1)
grep -qF "$MNT" <<<"$out" && ok "status without MOUNTPOINT lists this mount" ||
	bad "status without MOUNTPOINT lists this mount" "$out"

check "flush --wait: nothing pending in write-through mode" "$FERRYFS" flush "$MNT" --wait
refuse "pause: refused in write-through mode" "$FERRYFS" pause "$MNT"
out=$("$FERRYFS" pause "$MNT" 2>&1)
[ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "write-through" <<<"$out" &&
	ok "pause says why in one line" || bad "pause says why in one line" "$out"
refuse "status of a directory that is no ferryfs mount" "$FERRYFS" status /tmp
refuse "flush without MOUNTPOINT" "$FERRYFS" flush
refuse "unknown argument" "$FERRYFS" status "$MNT" --bogus
refuse "another user may not ask" setpriv --reuid=1000 --regid=1000 --clear-groups \
	"$FERRYFS" status "$MNT"

v=$(getfattr --absolute-names --only-values -n user.ferryfs.state "$MNT/f" 2>&1)
[ "$v" = clean ] && ok "user.ferryfs.state is clean" || bad "user.ferryfs.state is clean" "$v"
refuse "user.ferryfs.state is read-only" setfattr -n user.ferryfs.state -v dirty "$MNT/f"
out=$(getfattr --absolute-names -d -m - "$MNT/f" 2>&1)
grep -q ferryfs <<<"$out" && bad "user.ferryfs.state is not listed" "$out" ||
	ok "user.ferryfs.state is not listed"
out=$(getfattr --absolute-names -d -m - "$REMOTE/f" 2>&1)
grep -q ferryfs <<<"$out" && bad "user.ferryfs.state is not stored on the remote" "$out" ||
	ok "user.ferryfs.state is not stored on the remote"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
