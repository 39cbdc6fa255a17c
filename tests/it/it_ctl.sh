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
grep -q "write-back" <<<"$out" && ok "status names the mode" || bad "status names the mode" "$out"
grep -q "path:$(readlink -f "$REMOTE")" <<<"$out" && ok "status names the remote" ||
	bad "status names the remote" "$out"

# pause: the write stays in the journal, status says so; flush --wait
# after resume puts it on the remote
check "pause" "$FERRYFS" pause "$MNT"
echo paused >"$MNT/g"
sync "$MNT/g"
sleep 0.5
json=$("$FERRYFS" status "$MNT" --json 2>&1)
if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["ok"] and d["paused"] and d["pending_bytes"] + d["pending_ops"] > 0 and not d["drained"] and len(d["streams"]) == 4' "$json" 2>/dev/null; then
	ok "status --json while paused: pending work, 4 streams"
else
	bad "status --json while paused: pending work, 4 streams" "$json"
fi
[ ! -e "$REMOTE/g" ] && ok "paused: nothing reaches the remote" ||
	bad "paused: nothing reaches the remote" "$(ls -l "$REMOTE")"
v=$(getfattr --absolute-names --only-values -n user.ferryfs.state "$MNT/g" 2>&1)
[ "$v" = dirty ] && ok "user.ferryfs.state is dirty while paused" ||
	bad "user.ferryfs.state is dirty while paused" "$v"
out=$("$FERRYFS" status "$MNT/g" 2>&1)
[ "$out" = "$MNT/g: dirty" ] && ok "status FILE: dirty while paused" ||
	bad "status FILE: dirty while paused" "$out"
refuse "status of a file outside any mount" "$FERRYFS" status /etc/hostname
out=$(timeout 10 "$FERRYFS" flush "$MNT" --wait 2>&1)
rc=$?
[ "$rc" = 1 ] && grep -q "paused.*ferryfs resume" <<<"$out" &&
	ok "flush --wait while paused: exit 1 at once, says to resume" ||
	bad "flush --wait while paused: exit 1 at once, says to resume" "exit $rc: $out"
check "resume" "$FERRYFS" resume "$MNT"
check "flush --wait" "$FERRYFS" flush "$MNT" --wait
[ "$(cat "$REMOTE/g" 2>/dev/null)" = paused ] && ok "after flush --wait the remote has it" ||
	bad "after flush --wait the remote has it" "$(cat "$REMOTE/g" 2>&1)"
out=$("$FERRYFS" status "$MNT/g" --json 2>&1)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["state"] == "clean"' "$out" 2>/dev/null &&
	ok "status FILE --json: clean after the flush" ||
	bad "status FILE --json: clean after the flush" "$out"

json=$("$FERRYFS" status "$MNT" --json 2>&1)
if python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["ok"] and d["pending_bytes"] == 0 and d["pending_ops"] == 0 and d["drained"] and "remote_bytes_written" in d and "resent_bytes" in d' "$json" 2>/dev/null; then
	ok "status --json is JSON with the counters, nothing pending"
else
	bad "status --json is JSON with the counters, nothing pending" "$json"
fi
written=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["remote_bytes_written"])' "$json" 2>/dev/null)
[ "${written:-0}" -ge 13 ] && ok "remote bytes written are counted" ||
	bad "remote bytes written are counted" "$written"

out=$("$FERRYFS" status 2>&1)
grep -qF "$MNT" <<<"$out" && ok "status without MOUNTPOINT lists this mount" ||
	bad "status without MOUNTPOINT lists this mount" "$out"

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

# a hard link's newest name removed while an older one remains: what was
# written through it reaches the older name (the flush used to park it
# nowhere, and flush --wait waited for ever)
echo one >"$MNT/hl1"
check "flush --wait (hard links)" "$FERRYFS" flush "$MNT" --wait
ln "$MNT/hl1" "$MNT/hl2" && echo two >>"$MNT/hl2" && rm "$MNT/hl2"
check "flush --wait after the newest link is removed" timeout 60 "$FERRYFS" flush "$MNT" --wait
[ "$(cat "$REMOTE/hl1" 2>&1)" = "$(printf 'one\ntwo')" ] && [ ! -e "$REMOTE/hl2" ] &&
	ok "the remote has the older name with what the newest one wrote" ||
	bad "the remote has the older name with what the newest one wrote" "$(ls "$REMOTE"; cat "$REMOTE/hl1")"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
