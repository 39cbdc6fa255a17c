#!/bin/bash
# it_units.sh BUILD_DIR - the systemd units as installed: systemd-analyze
# verify, and their commands run as the units would run them.
#
# Registered with ctest (labels "mount;pkg", ~3 s). PID 1 here is not
# systemd (CI's neither), so no unit is started by systemd: the test
# installs BUILD_DIR with `cmake --install --prefix /usr` into a DESTDIR
# and, in a private mount namespace, lays that tree's /usr/bin,
# /usr/sbin and /usr/share/man over the system's (overlayfs, as
# it_mount_helper.sh does) and an fstab of its own over /etc/fstab. There:
#   1. `systemd-analyze verify --generators=yes` of every unit installed
#      (lib/systemd/system/*.service, templates as an instance each), the
#      ExecStart= paths and the man pages of Documentation= found; the
#      fstab line of ferryfs(8) (_netdev, x-systemd.requires=,
#      x-systemd.automount) through systemd-fstab-generator, its .mount
#      and .automount units verified too (ferryfs-flush@ of that mount
#      is verified with them: BindsTo= the generated mount unit);
#   2. ferry-agent@INSTANCE.service's ExecStart=, with %f/%i expanded,
#      the installed /etc/default/ferry-agent (and an
#      /etc/default/ferry-agent@INSTANCE for the port and the key) read
#      as EnvironmentFile= reads them, NOTIFY_SOCKET set (Type=notify),
#      under what can be had of its sandbox without systemd: the file
#      system read-only but for %f (ProtectSystem=strict, ReadWritePaths=)
#      and no new privileges (setpriv --no-new-privs). READY=1 arrives, a
#      ferryfs mount flushes a file through it (the streams say "via":
#      "agent"), the file lands in %f. PrivateTmp= and the Protect*=
#      settings are checked by the verify only;
#   3. ferryfs-flush@INSTANCE.service on a mount made from the fstab line
#      (mount -T FSTAB): ExecStart=, then data written with the flush
#      paused and resumed, ExecStop= (`ferryfs flush %f --wait`) under its
#      TimeoutStopSec=: exit 0 and the share has the data (SHA-256), then
#      umount; with the flush paused ExecStop= exits 1 at once (no hang
#      of the shutdown) and umount leaves the journal.
# Prints "ok N - name" / "not ok N - name: detail", then "N passed,
# M failed". Exit 1 on failure, 77 without root, /dev/fuse, unshare,
# overlayfs, systemd-analyze, python3 or setpriv.
set -u
# shellcheck source=tests/pkg/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ "${1:-}" != --inner ]; then
	if [ $# -ne 1 ]; then
		echo "usage: it_units.sh BUILD_DIR" >&2
		exit 2
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "# skip: needs root"
		exit 77
	fi
	for tool in systemd-analyze python3 setpriv unshare; do
		if ! command -v "$tool" >/dev/null 2>&1; then
			echo "# skip: no $tool"
			exit 77
		fi
	done
	pkg_ns_run units "$1" "$0" ""
fi

# --- inside the private mount namespace -------------------------------------
T=$2
U=$T/root/lib/systemd/system
R=$T/share
M=$T/mnt
J=$T/journal
A=$T/export # the agent's root
mkdir -p "$R" "$M" "$A" "$T/verify"

finish() {
	umount "$M" 2>/dev/null
	[ -n "${agent_pid:-}" ] && kill "$agent_pid" 2>/dev/null
	tally
	exit
}
field() { findmnt -n -o "$2" --mountpoint "$1" 2>/dev/null | tail -n 1; }
daemon_gone() {
	local _
	for _ in $(seq 1 100); do
		pgrep -f -- "ferryfs mount $R " >/dev/null || return 0
		sleep 0.1
	done
	return 1
}

# unit_cmd UNIT KEY INSTANCE: the command line of KEY= (ExecStart, ...)
# with the specifiers systemd expands here: %i (the instance as named),
# %f (unescaped, with a leading /), %%
unit_cmd() {
	local line path
	line=$(sed -n "s/^$2=//p" "$1" | head -n 1)
	path=/$(systemd-escape --unescape --path "$3")
	path=${path//\/\//\/}
	line=${line//%%/$'\001'}
	line=${line//%i/$3}
	line=${line//%f/$path}
	printf '%s\n' "${line//$'\001'/%}"
}
# unit_env UNIT INSTANCE: the EnvironmentFile= lines' files, %i expanded,
# "-" (may be missing) honoured; KEY=VALUE as systemd reads them
unit_env() {
	local f
	for f in $(sed -n 's/^EnvironmentFile=//p' "$1"); do
		f=${f//%i/$2}
		case $f in -*) f=${f#-}; [ -e "$f" ] || continue ;; esac
		grep -E '^[A-Za-z_][A-Za-z0-9_]*=' "$f"
	done
}
# run_as_unit UNIT KEY INSTANCE [WRAPPER...]: run KEY='s command as the
# unit does, in the foreground: the environment of its EnvironmentFile=s
# and EXTRA_ENV=() only (env -i), ${VAR} and $VAR expanded (the values
# here have no spaces), under WRAPPER (setpriv ...) if given
EXTRA_ENV=()
run_as_unit() {
	local unit=$1 key=$2 inst=$3 cmd
	shift 3
	cmd=$(unit_cmd "$unit" "$key" "$inst")
	(
		set -a
		eval "$(unit_env "$unit" "$inst")"
		set +a
		eval "set -- \"\$@\" $cmd"
		mapfile -t envs < <(unit_env "$unit" "$inst")
		exec env -i "${envs[@]}" "${EXTRA_ENV[@]}" "$@"
	)
}

for d in bin sbin share/man; do
	if ! mount -t overlay overlay -o "lowerdir=$T/root/usr/$d:/usr/$d" "/usr/$d"; then
		notok "overlay the installed /usr/$d" "mount -t overlay failed"
		finish
	fi
done

# --- 1. systemd-analyze verify ---------------------------------------------
units=$(cd "$U" 2>/dev/null && ls -- *.service 2>/dev/null)
check "units installed in /lib/systemd/system" "$(ls -R "$T/root" | head -20)" \
	[ -n "$units" ]
MINST=$(systemd-escape --path "$M")
AINST=$(systemd-escape --path "$A")
printf 'nas:/export %s nfs _netdev 0 0\n' "$R" >"$T/fstab"
printf '%s %s fuse.ferryfs defaults,_netdev,x-systemd.requires=%s,x-systemd.automount,streams=2,journal=%s 0 0\n' \
	"$R" "$M" "$R" "$J" >>"$T/fstab"
mount --bind "$T/fstab" /etc/fstab || notok "bind our fstab" "mount failed"
for u in $units; do
	case $u in
	ferry-agent@.service) v=ferry-agent@$AINST.service ;;
	ferryfs-flush@.service) v=ferryfs-flush@$MINST.service ;;
	*@.service) v=${u%@.service}@x.service ;;
	*) v=$u ;;
	esac
	cp "$U/$u" "$T/verify/$v"
	out=$(systemd-analyze verify --generators=yes "$T/verify/$v" 2>&1)
	check "systemd-analyze verify $u (as $v)" "$(echo "$out" | tr '\n' '|')" \
		[ $? = 0 -a -z "$out" ]
done
out=$(systemd-analyze verify --generators=yes "$MINST.mount" "$MINST.automount" 2>&1)
check "systemd-analyze verify the fstab line's $MINST.mount and .automount" \
	"$(echo "$out" | tr '\n' '|')" [ $? = 0 -a -z "$out" ]

# --- 2. ferry-agent@.service's ExecStart= ------------------------------------
AU=$U/ferry-agent@.service
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
W=$T/w # a tmpfs: what the test writes while / is read-only
mkdir -p "$W" && mount -t tmpfs none "$W"
key=$W/agent.key
echo "bm90IGEgc2VjcmV0IGtleSBqdXN0IGEgdGVzdCBrZXkh" >"$key"
chmod 600 "$key"
# /etc/default as the package leaves it, plus this instance's settings
mkdir -p "$T/default"
cp "$T/root/etc/default/ferry-agent" "$T/default/"
printf 'FERRY_AGENT_LISTEN=127.0.0.1:%s\nFERRY_AGENT_KEY=%s\n' "$port" "$key" \
	>"$T/default/ferry-agent@$AINST"
mount --bind "$T/default" /etc/default
cmd=$(unit_cmd "$AU" ExecStart "$AINST")
check "ferry-agent@: ExecStart= serves the instance's directory" "$cmd" \
	grep -qF -- "--root $A " <<<"$cmd"
check "ferry-agent@: Type=notify" "$(grep ^Type "$AU")" grep -q '^Type=notify$' "$AU"
# systemd's notify socket, and what arrives on it
python3 - "$W/notify" "$W/notify.out" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(15)
try:
    open(sys.argv[2], "w").write(s.recv(4096).decode())
except socket.timeout:
    pass
PY
listener=$!
for _ in $(seq 1 50); do [ -S "$W/notify" ] && break; sleep 0.05; done
# ProtectSystem=strict with ReadWritePaths=%f, NoNewPrivileges=yes: in
# a mount namespace of the agent's own, every mount but /proc, /sys, /dev
# read-only, %f a writable bind mount of itself; setpriv --no-new-privs
cat >"$T/sandbox.sh" <<'SH'
#!/bin/bash
rw=$1
shift
mount --bind "$rw" "$rw" || exit 1
for m in $(findmnt -rno TARGET | tac); do
	case $m in /proc | /proc/* | /sys | /sys/* | /dev | /dev/* | "$rw") continue ;; esac
	mount -o remount,bind,ro "$m" 2>/dev/null
done
touch /.ferryfs-sandbox 2>/dev/null && { echo "sandbox: / writable" >&2; exit 1; }
exec setpriv --no-new-privs "$@"
SH
chmod +x "$T/sandbox.sh"
EXTRA_ENV=(NOTIFY_SOCKET="$W/notify")
run_as_unit "$AU" ExecStart "$AINST" "$(command -v unshare)" --mount \
	--propagation private "$T/sandbox.sh" "$A" >"$W/agent.log" 2>&1 &
EXTRA_ENV=()
wait "$listener"
check "ferry-agent@: READY=1 on NOTIFY_SOCKET" \
	"got '$(cat "$W/notify.out" 2>/dev/null)'; log: $(tr '\n' '|' <"$W/agent.log")" \
	grep -q '^READY=1' "$W/notify.out"
agent_pid=$(pgrep -f -- "ferry-agent --root $A " | head -n 1)
check "ferry-agent@: no new privileges" "pid '$agent_pid'" \
	grep -q 'NoNewPrivs:[[:space:]]*1' "/proc/${agent_pid:-0}/status"
check "ferry-agent@: / read-only, %f writable (its mountinfo)" \
	"$(awk -v a="$A" '$5 == "/" || $5 == a { print $5, $6 }' "/proc/${agent_pid:-0}/mountinfo" | tr '\n' ' ')" \
	awk -v a="$A" '$5 == "/" && $6 ~ /^ro/ { r = 1 } $5 == a && $6 ~ /^rw/ { w = 1 }
		END { exit !(r && w) }' "/proc/${agent_pid:-0}/mountinfo"
# a mount of the agent's root, flushing through it (the share is %f)
if ferryfs mount "$A" "$M" -o "agent=127.0.0.1:$port,agent_key=$key,journal=$W/j" 2>"$W/m.err"; then
	head -c $((3 << 20)) /dev/urandom >"$W/a.src"
	cp "$W/a.src" "$M/a"
	out=$(timeout 60 ferryfs flush "$M" --wait 2>&1)
	via=$(ferryfs status "$M" --json | python3 -c 'import json,sys
d = json.load(sys.stdin)
print(sum(s["remote_bytes_written"] for s in d["streams"] if s["via"] == "agent"))')
	umount "$M"
	check "ferry-agent@: a mount flushes through it" \
		"$out; via the agent: ${via:-?} bytes" [ "${via:-0}" -ge $((3 << 20)) ]
	check "ferry-agent@: the file is in %f (SHA-256)" "$(ls -l "$A" 2>&1 | tr '\n' ' ')" \
		[ "$(sha256sum <"$W/a.src")" = "$(sha256sum <"$A/a" 2>/dev/null)" ]
else
	notok "ferry-agent@: a mount flushes through it" "mount: $(cat "$W/m.err")"
fi
kill "$agent_pid" 2>/dev/null
wait "$agent_pid" 2>/dev/null
agent_pid=

# --- 3. ferryfs-flush@.service around a mount from the fstab line ----------
FU=$U/ferryfs-flush@.service
out=$(env -i /usr/bin/mount -T /etc/fstab "$M" 2>&1)
check "fstab line (mount -T /etc/fstab, env -i): mounted" \
	"exit $?: $out, type '$(field "$M" FSTYPE)'" [ "$(field "$M" FSTYPE)" = fuse.ferryfs ]
if [ "$(field "$M" FSTYPE)" != fuse.ferryfs ]; then
	finish
fi
check "ferryfs-flush@: ExecStop= flushes the instance's mount point" \
	"$(unit_cmd "$FU" ExecStop "$MINST")" \
	[ "$(unit_cmd "$FU" ExecStop "$MINST")" = "/usr/bin/ferryfs flush $M --wait" ]
run_as_unit "$FU" ExecStart "$MINST"
check "ferryfs-flush@: ExecStart= exits 0" "exit $?" [ $? = 0 ]
stop_s=$(sed -n 's/^TimeoutStopSec=//p' "$FU")
case $stop_s in *min) stop_s=$((${stop_s%min} * 60)) ;; *s) stop_s=${stop_s%s} ;; esac
ferryfs pause "$M" >/dev/null
head -c $((8 << 20)) /dev/urandom >"$T/b.src"
cp "$T/b.src" "$M/b" && sync "$M/b"
check "paused: the data is not on the share" "$(ls "$R")" [ ! -e "$R/b" ]
t0=$(date +%s.%N)
run_as_unit "$FU" ExecStop "$MINST" >"$T/stop.out" 2>&1
rc=$?
t1=$(date +%s.%N)
grep -q paused "$T/stop.out"
said=$?
check "ExecStop= with the flush paused: exit 1 at once, says why" \
	"exit $rc in $(echo "$t1 - $t0" | bc) s: $(cat "$T/stop.out")" \
	[ "$rc" = 1 -a "$said" = 0 ]
ferryfs resume "$M" >/dev/null
timeout "${stop_s:-600}" bash -c "$(declare -f unit_cmd unit_env run_as_unit); EXTRA_ENV=(); run_as_unit '$FU' ExecStop '$MINST'" >"$T/stop.out" 2>&1
rc=$?
check "ExecStop= (ferryfs flush --wait, TimeoutStopSec=${stop_s}s): exit 0" \
	"exit $rc: $(cat "$T/stop.out")" [ "$rc" = 0 ]
check "after ExecStop=: the share has the data (SHA-256)" "differs" \
	[ "$(sha256sum <"$T/b.src")" = "$(sha256sum <"$R/b" 2>/dev/null)" ]
umount "$M"
check "then umount(8): the daemon ends" "still running" daemon_gone
# with the flush paused: ExecStop= fails at once, umount keeps the journal
env -i /usr/bin/mount -T /etc/fstab "$M" >/dev/null 2>&1
ferryfs pause "$M" >/dev/null
echo pending >"$M/c" && sync "$M/c"
run_as_unit "$FU" ExecStop "$MINST" >/dev/null 2>&1
rc=$?
umount "$M"
daemon_gone
check "paused at the stop: ExecStop= exit 1, umount leaves the journal" \
	"exit $rc, $(ls "$J" 2>&1)" [ "$rc" = 1 -a -s "$J/meta.mdb" -a ! -e "$R/c" ]
env -i /usr/bin/mount -T /etc/fstab "$M" >/dev/null 2>&1
ferryfs resume "$M" >/dev/null
timeout 60 ferryfs flush "$M" --wait >/dev/null 2>&1
check "the next mount flushes what the journal kept" "$(ls "$R")" \
	[ "$(cat "$R/c" 2>/dev/null)" = pending ]
finish
