#!/bin/bash
# it_ctl_dir.sh FERRYFS - the control socket's directory and who answers
# on it (issue 38). As root, in a mount namespace of its own with a tmpfs
# on /run (so /run/ferryfs, the directory of root's mounts, is the test's
# and no other test's):
#
# 1. /run/ferryfs made by another user (nobody; chown) before the mount,
#    and that user's listener answering every command "drained" on the
#    mount's socket name: the daemon refuses the directory with one line
#    naming its owner, and `ferryfs flush --wait` does not believe the
#    listener (exit 1, "not believed"); on 57bd6a8 it printed
#    "everything is on the remote" and exited 0;
# 2. /run/ferryfs a symlink to a directory of root's: refused, no socket
#    made through it, `ferryfs status` does not reach the mount;
# 3. /run/ferryfs of root's but writable by others (0777): refused;
# 4. of root's with mode 0750: made 0700 and used; absent: made 0700
#    and used (status and flush --wait work).
#
# A user's mount uses $XDG_RUNTIME_DIR/ferryfs or /tmp/ferryfs-UID with
# the same checks; they are not mounted here (/dev/fuse is root's only on
# this CI). Prints "ok N - name" / "not ok N - name: detail". Exit 1 on
# failure, 77 without root, /dev/fuse, fusermount3, unshare, setpriv or
# python3.
set -u

if [ $# -ne 1 ]; then
	echo "usage: it_ctl_dir.sh FERRYFS" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "# skip: needs root and /dev/fuse"
	exit 77
fi
for tool in fusermount3 unshare setpriv python3 mountpoint timeout; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "# skip: no $tool"
		exit 77
	fi
done
FERRYFS=$(readlink -f "$1")
# the other user's listener runs a python3 it may execute (not one under
# root's home, as a pyenv shim is)
PY_OTHER=
for py in /usr/bin/python3 /usr/local/bin/python3; do
	if [ -x "$py" ] && setpriv --reuid=65534 --regid=65534 --clear-groups \
		"$py" -c '' 2>/dev/null; then
		PY_OTHER=$py
		break
	fi
done
if [ -z "$PY_OTHER" ]; then
	echo "# skip: no python3 that user 65534 may run"
	exit 77
fi

if [ "${IT_CTL_DIR_NS:-}" != 1 ]; then
	IT_CTL_DIR_NS=1 exec unshare -m --propagation private "$0" "$FERRYFS"
fi
if ! mount -t tmpfs -o mode=0755 it_ctl_dir /run; then
	echo "# skip: cannot mount a tmpfs on /run in a mount namespace"
	exit 77
fi

T=$(mktemp -d /tmp/ferryfs-ctldir.XXXXXX) || exit 1
chmod 0755 "$T"
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
bad() { n=$((n + 1)); fail=$((fail + 1)); echo "not ok $n - $1: $2"; }
M=$T/mnt
R=$T/remote
mkdir "$M" "$R"
DPID=
FAKE=
logs=0

is_mounted() { mountpoint -q "$M" 2>/dev/null; }
cleanup() {
	[ -n "$FAKE" ] && kill "$FAKE" 2>/dev/null
	is_mounted && { fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"; }
	[ -n "$DPID" ] && wait "$DPID" 2>/dev/null
	if [ "$fail" = 0 ]; then
		rm -rf "$T"
	else
		for f in "$T"/daemon.*.log; do
			echo "# ---- $f"
			tail -n 20 "$f"
		done
		echo "# kept $T"
	fi
}
trap cleanup EXIT

mount_it() {
	logs=$((logs + 1))
	LOG=$T/daemon.$logs.log
	"$FERRYFS" mount "$R" "$M" -f -o "journal=$T/j,cache=$T/c" >"$LOG" 2>&1 &
	DPID=$!
	for _ in $(seq 1 100); do
		is_mounted && break
		kill -0 "$DPID" 2>/dev/null || break
		sleep 0.05
	done
	if ! is_mounted; then
		bad "mount" "$(cat "$LOG")"
		exit 1
	fi
	# the control socket comes after the mount: wait for it or the
	# line that says there is none
	for _ in $(seq 1 100); do
		grep -q "no control socket" "$LOG" && break
		compgen -G "${1:-/run/ferryfs}/ctl-*.sock" >/dev/null && break
		sleep 0.05
	done
}

umount_it() {
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		fusermount3 -u "$M" 2>/dev/null && break
		sleep 0.3
	done
	wait "$DPID" 2>/dev/null
	DPID=
}

sock_name() { # the mount's socket name, from mountinfo
	awk -v m="$M" '$5 == m { split($3, d, ":"); n = "ctl-" d[1] "-" d[2] ".sock" } END { print n }' /proc/self/mountinfo
}

# --- 1. another user's directory and listener -------------------------
mkdir /run/ferryfs
chown nobody:nogroup /run/ferryfs 2>/dev/null || chown 65534:65534 /run/ferryfs
chmod 0755 /run/ferryfs
mount_it
echo pending >"$M/file"
if grep -q "owned by uid 65534, not by uid 0" "$LOG"; then
	ok "1: the daemon refuses a directory of another user's, says so"
else
	bad "1: the daemon refuses a directory of another user's, says so" "$(cat "$LOG")"
fi
name=$(sock_name)
setpriv --reuid=65534 --regid=65534 --clear-groups "$PY_OTHER" - "/run/ferryfs/$name" >"$T/fake.log" 2>&1 <<'EOF' &
import os, socket, sys
path = sys.argv[1]
try:
    os.unlink(path)  # the daemon's own, if it made one in our directory
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o666)
s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.recv(128)
    c.sendall(b'{"ok": true, "mountpoint": "x", "mode": "write-back", '
              b'"paused": false, "drained": true, "failed": 0, '
              b'"failed_ops": 0, "pending_bytes": 0, "pending_ops": 0}\n')
    c.close()
EOF
FAKE=$!
for _ in $(seq 1 100); do
	grep -q listening "$T/fake.log" && break
	sleep 0.05
done
out=$(timeout 30 "$FERRYFS" flush "$M" --wait 2>&1)
rc=$?
if [ "$rc" = 1 ] && grep -q "not believed" <<<"$out"; then
	ok "1: flush --wait does not believe another user's 'drained'"
else
	bad "1: flush --wait does not believe another user's 'drained'" "exit $rc: $out"
fi
kill "$FAKE" 2>/dev/null
wait "$FAKE" 2>/dev/null
FAKE=
umount_it
rm -rf /run/ferryfs

# --- 2. a symlink ---------------------------------------------------------
mkdir -m 0700 /run/elsewhere
ln -s /run/elsewhere /run/ferryfs
mount_it /run/elsewhere
if grep -q "'/run/ferryfs' is a symlink" "$LOG" &&
	! compgen -G "/run/elsewhere/ctl-*" >/dev/null; then
	ok "2: a symlink is refused, no socket made through it"
else
	bad "2: a symlink is refused, no socket made through it" \
		"$(cat "$LOG"; ls -l /run/elsewhere)"
fi
# (2 s: a client waits 10 s for a socket that is not there yet)
if out=$(timeout 2 "$FERRYFS" status "$M" 2>&1); then
	bad "2: status does not reach the mount through the symlink" "$out"
else
	ok "2: status does not reach the mount through the symlink"
fi
umount_it
rm -rf /run/ferryfs /run/elsewhere

# --- 3. writable by others ------------------------------------------------
mkdir /run/ferryfs
chmod 0777 /run/ferryfs
mount_it
if grep -q "'/run/ferryfs' may be written by others (mode 0777)" "$LOG"; then
	ok "3: a directory others may write in is refused"
else
	bad "3: a directory others may write in is refused" "$(cat "$LOG")"
fi
umount_it
rm -rf /run/ferryfs

# --- 4. ours: 0750 made 0700, absent made 0700 ----------------------------
for how in 0750 absent; do
	[ "$how" = absent ] || { mkdir /run/ferryfs && chmod "$how" /run/ferryfs; }
	mount_it
	echo "$how" >"$M/file"
	mode=$(stat -c '%a %U' /run/ferryfs 2>&1)
	if out=$(timeout 60 "$FERRYFS" flush "$M" --wait 2>&1) &&
		[ "$(cat "$R/file")" = "$how" ] && [ "$mode" = "700 root" ]; then
		ok "4: directory $how: 0700 ($mode), flush --wait works"
	else
		bad "4: directory $how: 0700 ($mode), flush --wait works" "$out"
	fi
	umount_it
	rm -rf /run/ferryfs
done

echo "$((n - fail)) passed, $fail failed"
[ "$fail" -eq 0 ]
