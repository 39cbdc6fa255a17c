#!/bin/bash
# mount_run.sh FERRYFS CMD [ARGS...]
#
# Runs CMD on a fresh ferryfs mount and tears the mount down afterwards,
# whatever happens. Used by ctest for every test labelled "mount"
# (tests/CMakeLists.txt, ferryfs_add_mount_test).
#
#   $T/remote   the backing directory (the "path" driver's share)
#   $T/mnt      the mount point
#   $T/daemon.log  the daemon's stdout+stderr (printed if anything failed)
#
# CMD sees MNT, REMOTE, FERRYFS and FERRYFS_T (= $T; "@T@" in FERRYFS_OPTS
# is replaced by it) in its environment, and in write-back
# mode (unless FERRYFS_OPTS has writeback=off) IT_REMOTE_SYNC, a command
# that flushes the mount to REMOTE. The journal is $T/journal and the
# block cache $T/cache unless FERRYFS_OPTS names them. FERRYFS_OPTS (word
# split on purpose, e.g. "-o journal=/x") is appended to the mount command;
# FERRYFS_DEBUG=1 adds -d. IT_TIMEOUT overrides CMD's time limit (seconds).
# IT_EXPECT_PASSTHROUGH=1: fail unless files passed through (see below).
#
# Another share: FERRYFS_REMOTE is the spec to mount instead of $T/remote
# (e.g. nfs://10.78.0.2/export/run1) and FERRYFS_REMOTE_DIR the local
# directory that holds the same files (the export's directory), which CMD
# then sees as REMOTE; both or neither must be set. The caller owns that
# directory: it is not removed.
#
# The daemon runs in the foreground (-f) as our child, so its pid and its
# whole stderr are ours; it_cli.sh covers the daemonizing mount.
#
# Exit: CMD's status; 77 (skip) without root, /dev/fuse or fusermount3;
# 1 if CMD passed but the mount could not be set up or torn down cleanly
# (lazy unmount needed, daemon still alive, daemon exit status non-zero).
set -u

log() { printf 'mount_run: %s\n' "$*"; }

if [ $# -lt 2 ]; then
	echo "usage: mount_run.sh FERRYFS CMD [ARGS...]" >&2
	exit 2
fi
FERRYFS=$1
shift

if [ "$(id -u)" != 0 ]; then
	log "skip: needs root"
	exit 77
fi
if [ ! -c /dev/fuse ]; then
	log "skip: no /dev/fuse"
	exit 77
fi
if ! command -v fusermount3 >/dev/null 2>&1; then
	log "skip: no fusermount3"
	exit 77
fi
for tool in mountpoint timeout; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		log "skip: no $tool"
		exit 77
	fi
done
if [ ! -x "$FERRYFS" ]; then
	log "error: '$FERRYFS' is not an executable"
	exit 1
fi
FERRYFS=$(readlink -f "$FERRYFS")

# CMD's own limit stays below ctest's TIMEOUT so that we, not ctest's
# SIGKILL, end a hung test and the mount is still torn down.
case "$(basename "$1")" in
it_programs*) limit=560 ;;
*) limit=270 ;;
esac
limit=${IT_TIMEOUT:-$limit}

T=$(mktemp -d /tmp/ferryfs-it.XXXXXX) || exit 1
# other uids (the tests switch to 1000 and 65534) must reach the mount
chmod 0755 "$T"
mkdir -m 0755 "$T/remote" "$T/mnt"
MNT=$T/mnt
REMOTE=$T/remote
SPEC=$REMOTE
if [ -n "${FERRYFS_REMOTE:-}" ] || [ -n "${FERRYFS_REMOTE_DIR:-}" ]; then
	if [ -z "${FERRYFS_REMOTE:-}" ] || [ ! -d "${FERRYFS_REMOTE_DIR:-}" ]; then
		log "error: FERRYFS_REMOTE needs FERRYFS_REMOTE_DIR, an existing directory"
		rm -rf "$T"
		exit 1
	fi
	SPEC=$FERRYFS_REMOTE
	REMOTE=$FERRYFS_REMOTE_DIR
fi
DAEMON_PID=
status=1
teardown_bad=0

# Mounted at $1? Reads mountinfo only: a stat of a hung FUSE mount blocks.
is_mounted() {
	awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo
}

daemon_alive() {
	[ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null
}

# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
	local rc
	trap - EXIT INT TERM HUP
	cd /
	if is_mounted "$MNT"; then
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			timeout -s KILL 10 fusermount3 -u "$MNT" \
				2>>"$T/umount.log" && break
			sleep 0.5
		done
		if is_mounted "$MNT"; then
			log "error: fusermount3 -u failed 10 times, lazy unmount"
			cat "$T/umount.log" 2>/dev/null
			fusermount3 -uz "$MNT" || umount -l "$MNT"
			teardown_bad=1
		fi
	fi
	if [ -n "$DAEMON_PID" ]; then
		for _ in $(seq 1 100); do
			daemon_alive || break
			sleep 0.1
		done
		if daemon_alive; then
			log "error: daemon $DAEMON_PID still running 10 s after unmount"
			# where it waits: each thread's kernel stack top, and
			# its children (smb workers)
			for t in /proc/"$DAEMON_PID"/task/*; do
				printf '  thread %s %s: %s\n' "${t##*/}" \
					"$(cat "$t/comm" 2>/dev/null)" \
					"$(head -n 3 "$t/stack" 2>/dev/null | tr '\n' ' ')"
			done
			ps -o pid,stat,etimes,wchan:30,args --ppid "$DAEMON_PID" 2>/dev/null
			teardown_bad=1
			kill -TERM "$DAEMON_PID" 2>/dev/null
			sleep 1
			kill -KILL "$DAEMON_PID" 2>/dev/null
		fi
		wait "$DAEMON_PID" 2>/dev/null
		rc=$?
		if [ "$rc" != 0 ]; then
			log "error: daemon exited with status $rc"
			teardown_bad=1
		fi
	fi
	if [ "$status" = 0 ] && [ "$teardown_bad" != 0 ]; then
		status=1
	fi
	if [ "$status" != 0 ] && [ "$status" != 77 ]; then
		log "---- daemon log ($T/daemon.log) ----"
		tail -n 200 "$T/daemon.log" 2>/dev/null
		log "---- end of daemon log ----"
	fi
	# mounts a test left inside the share (it_syscalls' small tmpfs)
	awk -v t="$REMOTE/" 'index($5, t) == 1 { print $5 }' \
		/proc/self/mountinfo | sort -r | while read -r m; do
		log "detaching $m left behind by the test"
		umount -l "$m"
	done
	if is_mounted "$MNT"; then
		log "error: $MNT still mounted, leaving $T in place"
	else
		rm -rf "$T"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'status=130; exit' INT
trap 'status=143; exit' TERM HUP

debug=
[ "${FERRYFS_DEBUG:-0}" = 1 ] && debug=-d
# @T@ in FERRYFS_OPTS is this run's directory (CMD sees it as FERRYFS_T)
FERRYFS_OPTS=${FERRYFS_OPTS:-}
FERRYFS_OPTS=${FERRYFS_OPTS//@T@/$T}
export FERRYFS_T=$T
# write-back (the default): a journal of our own, and checks of REMOTE
# first flush the mount (it_syscalls runs IT_REMOTE_SYNC before each)
journal=
case " ${FERRYFS_OPTS:-} " in
*journal=*) ;;
*) journal="-o journal=$T/journal" ;;
esac
case " ${FERRYFS_OPTS:-} " in
*cache=*) ;;
*) journal="$journal -o cache=$T/cache" ;;
esac
case " ${FERRYFS_OPTS:-} " in
*writeback=off*) unset IT_REMOTE_SYNC ;;
*) export IT_REMOTE_SYNC="$FERRYFS flush $MNT --wait >/dev/null" ;;
esac
# shellcheck disable=SC2086 # FERRYFS_OPTS is a list of words on purpose
"$FERRYFS" mount "$SPEC" "$MNT" -f $debug $journal ${FERRYFS_OPTS:-} \
	>"$T/daemon.log" 2>&1 </dev/null &
DAEMON_PID=$!

ready=0
for _ in $(seq 1 200); do
	if is_mounted "$MNT" && timeout -s KILL 5 mountpoint -q "$MNT"; then
		ready=1
		break
	fi
	daemon_alive || break
	sleep 0.1
done
if [ "$ready" != 1 ]; then
	if daemon_alive; then
		log "error: $MNT not mounted after 20 s"
	else
		log "error: daemon exited before the mount was ready"
	fi
	status=1
	exit
fi
log "mounted $SPEC at $MNT ($(findmnt -n -o FSTYPE "$MNT" 2>/dev/null), pid $DAEMON_PID)"

export MNT REMOTE FERRYFS
timeout --kill-after=10 "$limit" "$@"
status=$?
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
	log "error: '$*' timed out after $limit s"
fi
if ! daemon_alive; then
	log "error: daemon died while the test ran"
	[ "$status" = 0 ] && status=1
fi
log "test exited with status $status"
# IT_EXPECT_PASSTHROUGH=1 (with -o passthrough): the run must have passed
# files through the kernel, and every one must be closed again
if [ "$status" = 0 ] && [ "${IT_EXPECT_PASSTHROUGH:-0}" = 1 ]; then
	js=$("$FERRYFS" status "$MNT" --json 2>&1)
	opens=$(printf '%s' "$js" | sed -n 's/.*"passthrough_opens": \([0-9]*\).*/\1/p')
	files=$(printf '%s' "$js" | sed -n 's/.*"passthrough_files": \([0-9]*\).*/\1/p')
	log "passthrough: ${opens:-?} opens, ${files:-?} files still passing through"
	if ! printf '%s' "$js" | grep -q '"passthrough": true' ||
		[ "${opens:-0}" -eq 0 ] || [ "${files:-1}" -ne 0 ]; then
		log "error: expected passthrough opens, all closed: $js"
		status=1
	fi
fi
exit
