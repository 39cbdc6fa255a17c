#!/bin/bash
# smb_suite.sh - ferryfs's smb driver against a real SMB server (Samba):
# the CI entry of the SMB half of issue 4. As root:
#
#   tests/it/smb_suite.sh FERRYFS IT_SYSCALLS FERRY_AGENT [--keep]
#
# FERRYFS, IT_SYSCALLS and FERRY_AGENT are the built binaries (ctest
# passes $<TARGET_FILE:...>).
#
# 1. The server: tests/bench/nas.sh's smbd (share "nas", user "ferry"). If
#    nas.sh is up already (`nas.sh env` answers) it is used as it is and
#    left up; else `nas.sh up --rate none` here and `nas.sh down` at the
#    end. From `nas.sh env` come NAS_IP, NAS_SHARE_DIR (the share's
#    directory here), SMB_CRED_FILE (mode 0600) and CLIENT_NETNS (the
#    namespace that reaches NAS_IP).
# 2. Refusals, each a ferryfs mount that must fail with exit != 0 and one
#    clear line: a credentials file of mode 0644, a wrong password, a
#    password in the URL.
#    ferry-agent next to the share (issue 6): the agent in the NAS
#    namespace with --root at the share's directory, a write-back mount
#    of a directory of the share with agent=NAS_IP:7078/DIR. A tree (a
#    12 MiB file, small files, nested directories, a chmod) is flushed;
#    then appends to files Samba made, one under its own name, four under
#    names in other case (PRE1.TXT where the share has Pre1.txt) while
#    four copies of the tree's small files flush. Then: SHA-256 of each
#    file on the share's disk equal to the source, every file and
#    directory the agent made belongs to the owner Samba gave the files it
#    made (not root, the agent's user), the mode of the chmod kept, the
#    appends in the files Samba made (no second file by case, no conflict
#    copy, status "conflicts: 0": the agent's times compared at SMB's
#    100 ns; a batch's FINISH records its new base only once the batch
#    succeeded), no probe file left, the agent's "done:" lines hold at
#    least the 12 MiB, and smbclient, logged in as the share's user,
#    removes what the agent wrote.
# 3. A daemon (no -f): after fuse_daemonize's fork its workers are its
#    own children and are gone after the unmount. A dropped connection
#    (only when this run brought nas.sh up: the smbd
#    process serving our connection is killed, by its pid): a file open
#    across it goes on being written and read, a new file can be made, the
#    driver logs "connection lost" and "connection back".
#    SMB_SUITE_KILL_SMBD=1 runs it on a nas.sh that was up already (for
#    the one who brought it up).
#    What the share cannot hold (hard links, symlinks, fifos, another
#    owner, RENAME_EXCHANGE, Windows-forbidden or non-UTF-8 names, also in
#    a directory not flushed yet): a write-back mount answers each call as
#    a write-through one does (EPERM, EINVAL, EILSEQ: the list in
#    CANNOT_WANT), at once, and its flush then has nothing to give up.
# 4. it_syscalls and it_programs on ferryfs mounts of
#    smb://ferry@NAS_IP/nas/<run> -o credentials=SMB_CRED_FILE,writeback=off
#    (tests/it/mount_run.sh with FERRYFS_REMOTE, FERRYFS_REMOTE_DIR and
#    FERRYFS_OPTS): write-through, so that every call of the programs is a
#    call of the driver; the daemon in the client namespace (nsenter --net,
#    which keeps the host's mount namespace, so the FUSE mount is seen),
#    with IT_SKIP_REASON=smb and IT_SKIP_FEATURES=$SMB_SKIP (below): what
#    SMB2 without POSIX extensions and Samba's defaults cannot do. Each run
#    gets a fresh directory of the share, made here before the mount.
#    Both again with write-back (the default mount), each checked after
#    its flush as on the path driver.
# 5. Teardown, whatever happened: our run directories removed, nas.sh
#    taken down only if this run brought it up, the temp dir removed
#    (--keep keeps both and prints where).
#
# Exit: 0 if every run passed, 1 if one failed or the server did not come
# up, 77 (skip) without root, /dev/fuse, nas.sh or a way to start it.
set -u

SMB_SKIP=xattr,fallocate,seek_hole,exchange,enospc,symlink,symlink_times,hardlink,mknod,mode,owner,time_ns,win_names
# xattr          libsmbclient has no user xattrs (only its system.* ones):
#                no RMT_CAP_XATTR
# fallocate      no ALLOCATE call in libsmbclient: -EOPNOTSUPP
# seek_hole      holes are not reported: all of a file is data
# exchange       no atomic RENAME_EXCHANGE in SMB2: -EINVAL
# enospc         it_syscalls mounts a tmpfs inside REMOTE: smbd does not
#                see a mount made in the host's mount namespace (the NAS
#                has its own)
# remote_writer  a file changed on the share behind smbd's back is seen
#                only after the client's attribute cache lets go
# symlink        SMB2 without POSIX extensions has no symlinks: -EPERM
# hardlink       no hard links (libsmbclient has no link call): -EPERM
# mode           modes are made from DOS attributes (0755/0744); chmod
#                sets DOS attributes only; so access by other users
#                (which the kernel decides from the modes) is not checked
# owner          every file belongs to the login; chown elsewhere: -EPERM
# mknod          no fifos or sockets over SMB2: -EPERM
# symlink_times  no symlinks (above)
# time_ns        libsmbclient sets times with a struct timeval
#                (smbc_utimes): microseconds, not SMB's 100 ns
# win_names      names with \ : * ? " < > |, control characters or bytes
#                that are not UTF-8: SMB names are Windows names
#                (-EINVAL / -EILSEQ)

log() { printf 'smb_suite: %s\n' "$*"; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
keep=0
args=()
for a in "$@"; do
	case "$a" in
	--keep) keep=1 ;;
	-h | --help)
		sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) args+=("$a") ;;
	esac
done
if [ ${#args[@]} -lt 3 ]; then
	echo "usage: smb_suite.sh FERRYFS IT_SYSCALLS FERRY_AGENT [--keep]" >&2
	exit 2
fi
FERRYFS=$(readlink -f "${args[0]}")
IT_SYSCALLS=$(readlink -f "${args[1]}")
FERRY_AGENT=$(readlink -f "${args[2]}")

if [ "$(id -u)" != 0 ]; then
	log "skip: needs root"
	exit 77
fi
if [ ! -c /dev/fuse ]; then
	log "skip: no /dev/fuse"
	exit 77
fi
for f in "$FERRYFS" "$IT_SYSCALLS" "$FERRY_AGENT"; do
	if [ ! -x "$f" ]; then
		log "error: '$f' is not an executable"
		exit 1
	fi
done
NAS=$ROOT/tests/bench/nas.sh
if [ ! -x "$NAS" ]; then
	log "skip: no tests/bench/nas.sh"
	exit 77
fi

W=
SHARE_DIR=
nas_down=0 # we brought nas.sh up: take it down
rc_daemon= # the daemon of the reconnect check
agent_pid= # ferry-agent of the agent check
status=1

# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
	trap - EXIT INT TERM HUP
	cd /
	if [ -n "$agent_pid" ]; then
		kill "$agent_pid" 2>/dev/null
		wait "$agent_pid" 2>/dev/null
	fi
	if [ -n "$rc_daemon" ]; then
		if awk -v m="$W/mnt-rc" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; then
			fusermount3 -u "$W/mnt-rc" 2>/dev/null || fusermount3 -uz "$W/mnt-rc"
		fi
		kill "$rc_daemon" 2>/dev/null
	fi
	# a check that failed half-way may have left its mount
	if [ -n "$W" ]; then
		awk -v w="$W/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo |
			while read -r m; do
				fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m"
			done
	fi
	if [ "$keep" = 0 ] && [ -n "$SHARE_DIR" ]; then
		rm -rf "$SHARE_DIR"/smb-syscalls-$$ "$SHARE_DIR"/smb-programs-$$ \
			"$SHARE_DIR"/smb-refuse-$$ "$SHARE_DIR"/smb-reconnect-$$ \
			"$SHARE_DIR"/smb-daemon-$$ "$SHARE_DIR"/smb-wb-syscalls-$$ \
			"$SHARE_DIR"/smb-wb-programs-$$ "$SHARE_DIR"/smb-cannot-wt-$$ \
			"$SHARE_DIR"/smb-cannot-wb-$$ "$SHARE_DIR"/smb-aside-$$ \
			"$SHARE_DIR"/smb-agent-$$ "$SHARE_DIR"/smb-conns-$$
	fi
	if [ "$nas_down" = 1 ]; then
		"$NAS" down >/dev/null 2>&1 || log "warning: 'nas.sh down' failed"
	fi
	if [ -n "$W" ]; then
		if [ "$keep" = 1 ]; then
			log "kept $W${SHARE_DIR:+ and $SHARE_DIR/smb-*-$$}"
		else
			rm -rf "$W"
		fi
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'status=130; exit' INT
trap 'status=143; exit' TERM HUP

W=$(mktemp -d /tmp/ferryfs-smb.XXXXXX) || exit 1
chmod 0755 "$W"

# --- 1. the server -------------------------------------------------------------

if ! out=$("$NAS" env 2>/dev/null); then
	log "starting tests/bench/nas.sh (up --rate none)"
	nas_down=1
	if ! "$NAS" up --rate none >"$W/nas.log" 2>&1; then
		tail -n 5 "$W/nas.log"
		if grep -qi 'apt\|install' "$W/nas.log"; then
			log "skip: nas.sh cannot get its packages"
			status=77
		else
			log "error: nas.sh up failed"
		fi
		exit
	fi
	out=$("$NAS" env 2>/dev/null) || exit
fi
NAS_IP= SHARE_DIR= CRED= CLIENT_NETNS= NAS_NETNS=
while IFS= read -r line; do
	line=${line#export }
	key=${line%%=*}
	val=${line#*=}
	val=${val#[\"\']}
	val=${val%[\"\']}
	case "$key" in
	NAS_IP) NAS_IP=$val ;;
	NAS_SHARE_DIR) SHARE_DIR=$val ;;
	SMB_CRED_FILE) CRED=$val ;;
	CLIENT_NETNS) CLIENT_NETNS=$val ;;
	NAS_NETNS) NAS_NETNS=$val ;;
	esac
done <<<"$out"
[[ "$CLIENT_NETNS" == /* ]] || CLIENT_NETNS=/run/netns/$CLIENT_NETNS
[[ "$NAS_NETNS" == /* ]] || NAS_NETNS=/run/netns/$NAS_NETNS
if [ -z "$NAS_IP" ] || [ ! -d "$SHARE_DIR" ] || [ ! -r "$CRED" ] ||
	[ ! -e "$CLIENT_NETNS" ]; then
	log "error: nas.sh env gives no NAS_IP/NAS_SHARE_DIR/SMB_CRED_FILE/CLIENT_NETNS"
	exit
fi
SMB_URL=smb://ferry@$NAS_IP/nas
log "using nas.sh's smbd: $SMB_URL (shared from $SHARE_DIR)"

# The share's directories belong to the login (files written over SMB are
# ferry's): made here, then handed to ferry so smbd can write in them.
names="syscalls programs refuse reconnect daemon wb-syscalls wb-programs"
names+=" cannot-wt cannot-wb aside agent conns"
for name in $names; do
	mkdir -m 0777 "$SHARE_DIR/smb-$name-$$" || exit
	chown ferry: "$SHARE_DIR/smb-$name-$$" 2>/dev/null
done

# a ferryfs that runs in the client namespace (nsenter execs it: same pid)
cat >"$W/ferryfs" <<EOF
#!/bin/sh
exec nsenter --net=$CLIENT_NETNS "$FERRYFS" "\$@"
EOF
chmod +x "$W/ferryfs"

summary=()
failed=0

# --- 2. refusals -----------------------------------------------------------------

# refuse NAME WANT_REGEX SPEC OPTS...: a mount that must fail
refuse() {
	local name=$1 want=$2 spec=$3 rc line
	shift 3
	mkdir -p "$W/mnt-refuse"
	timeout -k 5 60 "$W/ferryfs" mount "$spec" "$W/mnt-refuse" -f "$@" \
		>"$W/refuse.log" 2>&1 </dev/null
	rc=$?
	if awk -v m="$W/mnt-refuse" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; then
		fusermount3 -u "$W/mnt-refuse"
	fi
	line=$(grep -E "$want" "$W/refuse.log" | head -n 1)
	if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ -n "$line" ]; then
		summary+=("ok - refused: $name (exit $rc: $line)")
	else
		failed=1
		summary+=("not ok - refused: $name (exit $rc; want a line matching '$want') FAILED")
		sed 's/^/    /' "$W/refuse.log"
	fi
}

install -m 0644 "$CRED" "$W/cred-0644"
refuse "credentials file of mode 0644" \
	"credentials file '.*' is readable .* refused" \
	"$SMB_URL/smb-refuse-$$" -o credentials="$W/cred-0644"
sed 's/^\([[:space:]]*password[[:space:]]*=\).*/\1 not-the-password/' \
	"$CRED" >"$W/cred-wrong"
chmod 0600 "$W/cred-wrong"
refuse "wrong password" "cannot log in to .*wrong user or password" \
	"$SMB_URL/smb-refuse-$$" -o credentials="$W/cred-wrong"
refuse "password in the url" "a password in the url is not taken" \
	"smb://ferry:secret@$NAS_IP/nas/smb-refuse-$$" -o credentials="$CRED"
refuse "missing credentials file" "cannot open credentials file" \
	"$SMB_URL/smb-refuse-$$" -o credentials="$W/no-such-file"
# no SMB server at that port of the NAS: its own error, not EIO
refuse "no server at the address" "cannot connect to .*: Connection refused" \
	"smb://ferry@$NAS_IP:4455/nas/smb-refuse-$$" -o credentials="$CRED"
# a port that closes every connection at once: the network's error, not
# "Input/output error" after "connection lost ... connection back"
nsenter --net="$NAS_NETNS" python3 -c '
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 4456))
s.listen(8)
s.settimeout(60)
while True:
    s.accept()[0].close()
' 2>/dev/null &
closer=$!
# listening before the mount tries it (python's start took over 0.5 s in
# CI's pass 1, beside other tests: "Connection refused")
for _ in $(seq 1 100); do
	nsenter --net="$NAS_NETNS" ss -Hltn 'sport = :4456' 2>/dev/null |
		grep -q . && break
	sleep 0.1
done
refuse "a server that closes the connection at once" \
	"cannot connect to .*: (Connection reset|Network dropped|Software caused)" \
	"smb://ferry@$NAS_IP:4456/nas/smb-refuse-$$" -o credentials="$CRED"
if grep -q "connection back" "$W/refuse.log"; then
	failed=1
	summary+=("not ok - no 'connection back' for a connection never made FAILED")
fi
kill "$closer" 2>/dev/null
wait "$closer" 2>/dev/null
# --- 3. a daemon, a dropped connection ------------------------------------------

# step WHAT CMD [ARGS...]: CMD's output to a log; "ok - WHAT" in the
# summary, or "not ok - WHAT FAILED" and the log
step() {
	local what=$1 log=$W/step.log t0=$SECONDS
	shift
	if "$@" >"$log" 2>&1; then
		summary+=("ok - $what ($((SECONDS - t0)) s)")
	else
		failed=1
		summary+=("not ok - $what FAILED ($((SECONDS - t0)) s)")
		sed 's/^/    /' "$log"
	fi
}

# ferryfs as a daemon: its workers are forked again after fuse_daemonize's
# fork (connections=3: at least 3 of them, its children; the flusher's
# streams have theirs), and all of them are gone after the unmount
daemon_check() {
	local mnt=$W/mnt-d pid= workers n p s gone
	mkdir -p "$mnt"
	"$W/ferryfs" mount "$SMB_URL/smb-daemon-$$" "$mnt" \
		-o credentials="$CRED",connections=3 </dev/null || return 1
	echo daemon >"$mnt/d.txt" && [ "$(cat "$mnt/d.txt")" = daemon ] ||
		{ fusermount3 -u "$mnt"; return 1; }
	for p in $(pgrep -x ferryfs); do
		[ "$(tr '\0' ' ' </proc/$p/cmdline)" = \
			"$FERRYFS mount $SMB_URL/smb-daemon-$$ $mnt -o credentials=$CRED,connections=3 " ] &&
			pid=$p
	done
	workers=$(pgrep -P "${pid:-0}" | tr '\n' ' ')
	n=$(echo "$workers" | wc -w)
	# each a new image (exec), not a bare fork of the threaded daemon: a
	# fork's child can block on a lock another thread held (CI saw ASan's)
	for p in $workers; do
		[ "$(tr '\0' ' ' </proc/$p/cmdline | cut -d' ' -f2)" = \
			--ferryfs-smb-worker ] ||
			{ echo "worker $p is not exec'ed: $(tr '\0' ' ' </proc/$p/cmdline)"
			  fusermount3 -u "$mnt"; return 1; }
	done
	fusermount3 -u "$mnt" || return 1
	[ -n "$pid" ] && [ "$n" -ge 3 ] ||
		{ echo "daemon '$pid' with $n workers: $workers"; return 1; }
	# exited: gone, or a zombie that init has yet to reap (1-2 s late
	# in this VM)
	for _ in $(seq 1 100); do
		gone=1
		for p in $pid $workers; do
			read -r s 2>/dev/null <"/proc/$p/stat" || continue
			s=${s##*) }
			[ "${s%% *}" = Z ] || gone=0
		done
		[ "$gone" = 1 ] && return 0
		sleep 0.1
	done
	echo "daemon $pid or its workers ($workers) still there 10 s after the unmount"
	return 1
}

step "a daemon: workers of its own (exec'ed), all gone after the unmount" daemon_check

# A flush stream and a read-ahead stream are one connection (one worker)
# each, whatever the mount's own pool has (connections=N): 2 + 3 + 2
# workers here. Each read-ahead stream had a pool of N (2 + 3 + 2 x 2;
# a default mount ran 24 workers where 12 serve, and spent ~2 s of CPU
# starting them while the first `cp` waited).
conns_check() {
	local mnt=$W/mnt-c pid n last=-1 same=0
	mkdir -p "$mnt"
	"$W/ferryfs" mount "$SMB_URL/smb-conns-$$" "$mnt" -f \
		-o credentials="$CRED",connections=2,streams=3,readahead=2 \
		>"$W/conns.log" 2>&1 </dev/null &
	pid=$!
	# the streams start after the mount: until the count holds for 2 s
	for _ in $(seq 1 300); do
		n=$(pgrep -P "$pid" | wc -l)
		if [ "$n" = "$last" ]; then same=$((same + 1)); else same=0 last=$n; fi
		{ [ "$n" -gt 7 ] || [ "$same" -ge 20 ]; } && break
		sleep 0.1
	done
	fusermount3 -u "$mnt" || fusermount3 -uz "$mnt"
	wait "$pid"
	[ "$n" = 7 ] || { echo "$n workers, want 2 + 3 + 2 = 7"; cat "$W/conns.log"; return 1; }
}
step "one connection per flush and per read-ahead stream" conns_check

# --- ferry-agent next to the share ------------------------------------------------

# smbclient as the share's user, in the client namespace, in DIR: CMDS
smbc() {
	nsenter --net="$CLIENT_NETNS" smbclient "//$NAS_IP/nas" -A "$CRED" \
		-D "$1" -c "$2"
}

# the agent's "done:" lines: bytes written, summed
agent_written() {
	awk '/: done: / { w += $(NF-8) } END { print w + 0 }' "$W/agent.log"
}

agent_check() {
	local dir=smb-agent-$$ mnt=$W/mnt-agent src=$W/agent-src owner f bad=0
	local d=$SHARE_DIR/smb-agent-$$ big=$((12 << 20)) n i id
	local made=$'made by samba\nappended'
	printf 'made by samba\n' >"$W/pre.txt"
	smbc "$dir" "put $W/pre.txt Same.txt; put $W/pre.txt Pre1.txt; put $W/pre.txt Pre2.txt; put $W/pre.txt Pre3.txt; put $W/pre.txt Pre4.txt" ||
		return 1
	owner=$(stat -c %u:%g "$d/Same.txt") || return 1
	[ "$owner" != 0:0 ] || { echo "Samba made Same.txt as root"; return 1; }
	head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/agent.key"
	chmod 0600 "$W/agent.key"
	nsenter --net="$NAS_NETNS" "$FERRY_AGENT" --root "$SHARE_DIR" \
		--listen "$NAS_IP:7078" --key-file "$W/agent.key" \
		>"$W/agent.log" 2>&1 &
	agent_pid=$!
	for _ in $(seq 1 50); do
		grep -q "serving" "$W/agent.log" && break
		sleep 0.1
	done
	mkdir -p "$mnt" "$src/tree/a/b"
	"$W/ferryfs" mount "$SMB_URL/$dir" "$mnt" -o credentials="$CRED",agent="$NAS_IP:7078/$dir",agent_key="$W/agent.key",journal="$W/j-agent",cache="$W/c-agent" </dev/null ||
		return 1
	head -c "$big" /dev/urandom >"$src/tree/big"
	for i in $(seq 1 20); do
		echo "small $i" >"$src/tree/a/b/f$i"
	done
	echo mode >"$src/tree/a/m" && chmod 0640 "$src/tree/a/m"
	# the tree (all its data through the agent), then appends: to a file
	# Samba made (times compared at SMB's 100 ns) and to files under other
	# letter case than the share's (the streams that meet them flush
	# through the share for a while) while a copy of the tree's small files
	# flushes, in batches, through the agent
	cp -a "$src/tree" "$mnt/" &&
		timeout 120 "$FERRYFS" flush --wait "$mnt" ||
		{ fusermount3 -u "$mnt"; return 1; }
	# a probe a killed daemon left (named by the journal and the stream)
	# is removed by the next mount of the same journal
	id=$("$FERRYFS" status --json "$mnt" |
		sed -n 's/.*"journal_id": "\([0-9a-f]*\)".*/\1/p')
	fusermount3 -u "$mnt" || return 1
	[ -n "$id" ] || { echo "no journal_id in status --json"; return 1; }
	smbc "$dir" "put $W/pre.txt .ferryfs-owner.$id.0" || return 1
	[ -e "$d/.ferryfs-owner.$id.0" ] || { echo "probe not planted"; return 1; }
	"$W/ferryfs" mount "$SMB_URL/$dir" "$mnt" -o credentials="$CRED",agent="$NAS_IP:7078/$dir",agent_key="$W/agent.key",journal="$W/j-agent",cache="$W/c-agent" </dev/null ||
		return 1
	mkdir "$mnt/tree2" &&
		echo appended >>"$mnt/Same.txt" &&
		for i in 1 2 3 4; do
			cp -a "$src/tree/a" "$mnt/tree2/a$i" &&
			echo appended >>"$mnt/PRE$i.TXT" || exit
		done &&
		timeout 120 "$FERRYFS" flush --wait "$mnt" ||
		{ fusermount3 -u "$mnt"; return 1; }
	"$FERRYFS" status "$mnt" >"$W/agent-status.txt"
	fusermount3 -u "$mnt" || return 1
	cat "$W/agent-status.txt"
	(cd "$src" && find tree -type f -exec sha256sum {} +
		for i in 1 2 3 4; do
			(cd tree && find a -type f -exec sha256sum {} +) |
				sed "s|  a/|  tree2/a$i/|"
		done) | sort -k2 >"$W/agent-src.sum"
	(cd "$d" && find tree tree2 -type f -exec sha256sum {} +) | sort -k2 >"$W/agent-dst.sum"
	cmp -s "$W/agent-src.sum" "$W/agent-dst.sum" ||
		{ echo "SHA-256 differ:"; diff "$W/agent-src.sum" "$W/agent-dst.sum"; bad=1; }
	f=$(find "$d/tree" "$d/tree2" ! -user "${owner%:*}" -o ! -group "${owner#*:}" | head -n 3)
	[ -z "$f" ] || { echo "not of $owner (Samba's owner):"; ls -ln $f; bad=1; }
	[ "$(stat -c %a "$d/tree/a/m")" = 640 ] ||
		{ echo "tree/a/m mode $(stat -c %a "$d/tree/a/m"), not 640"; bad=1; }
	for f in Same.txt Pre1.txt Pre2.txt Pre3.txt Pre4.txt; do
		[ "$(cat "$d/$f")" = "$made" ] || { echo "$f: '$(cat "$d/$f")'"; bad=1; }
	done
	# nothing else: no file by other case, no conflict copy, no probe
	# (but .ferryfs/, the journal's marker)
	f=$(cd "$d" && ls -a | grep -v '^\(\.\|\.\.\|\.ferryfs\|tree\|tree2\|Same\.txt\|Pre[1-4]\.txt\)$' | head -n 5)
	[ -z "$f" ] || { echo "left on the share: $f"; bad=1; }
	grep -q "conflicts: 0" "$W/agent-status.txt" ||
		{ echo "conflicts in the status"; bad=1; }
	for _ in $(seq 1 50); do
		[ "$(agent_written)" -ge "$big" ] && break
		sleep 0.1
	done
	n=$(agent_written)
	[ "$n" -ge "$big" ] ||
		{ echo "the agent wrote $n bytes, not the $big of tree/big"; cat "$W/agent.log"; bad=1; }
	# the share's user removes what the agent wrote
	smbc "$dir" "cd tree/a/b; del f*; cd ..; del m; rmdir b" ||
		{ echo "smbclient could not remove what the agent wrote"; bad=1; }
	[ ! -e "$d/tree/a/b" ] && [ ! -e "$d/tree/a/m" ] ||
		{ echo "still there after smbclient's removal:"; ls -lnR "$d/tree/a"; bad=1; }
	kill "$agent_pid" 2>/dev/null
	wait "$agent_pid" 2>/dev/null
	agent_pid=
	return $bad
}

step "ferry-agent over smb://: data through the agent, Samba's owner, names matched without case, no conflict, removable by the share's user" agent_check

# --- what the share cannot hold ----------------------------------------------

# Each call on a mount of an empty directory, and its answer as cannot_calls
# prints it; the same from both modes.
CANNOT_WANT='create f: ok
link: EPERM
symlink: EPERM
mkfifo: EPERM
chown to its owner: ok
chown to nobody: EPERM
chgrp to nogroup: EPERM
rename exchange: EINVAL
create a:b: EINVAL
create a*b: EINVAL
create a?b: EINVAL
create a"b: EINVAL
create a<b: EINVAL
create a>b: EINVAL
create a|b: EINVAL
create a\b: EINVAL
create a\x01b: EINVAL
create \xff: EILSEQ
rename f to a:b: EINVAL
mkdir d: ok
in d: create a:b: EINVAL
in d: create a|b: EINVAL
in d: mkdir a*d: EINVAL
in d: create \xff: EILSEQ
in d: link: EPERM
in d: symlink: EPERM
in d: write Case: ok'
# names in other case (Samba: "case sensitive = auto"): write-through
# writes into the file there is; write-back refuses a second name for it
# (its flush would make one file of the two: the later would overwrite it)
# (Unicode case too: "été" is "Été" on the share)
CANNOT_WANT_wt='in d: write case: ok
in d: rename d/g2 to d/CASE: ok
in d: write \xc3\x89t\xc3\xa9: ok
in d: write \xc3\xa9t\xc3\xa9: ok'
CANNOT_WANT_wb='in d: write case: EEXIST
in d: rename d/g2 to d/CASE: EEXIST
in d: write \xc3\x89t\xc3\xa9: ok
in d: write \xc3\xa9t\xc3\xa9: EEXIST'

# cannot_calls DIR: one line per call, "what: ok" or "what: ERRNO"
cannot_calls() {
	python3 - "$1" <<'EOF'
import ctypes, errno, os, sys
d = sys.argv[1].encode()
libc = ctypes.CDLL(None, use_errno=True)
def call(what, fn):
    try:
        fn()
        print(f"{what}: ok")
    except OSError as e:
        print(f"{what}: {errno.errorcode.get(e.errno, e.errno)}")
def p(n):
    return os.path.join(d, n if isinstance(n, bytes) else n.encode())
def create(n):
    os.close(os.open(p(n), os.O_CREAT | os.O_WRONLY, 0o644))
def exchange(a, b):
    if libc.renameat2(-100, p(a), -100, p(b), 2):  # RENAME_EXCHANGE
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def show(n):  # a name as CANNOT_WANT writes it
    return "".join(chr(c) if 32 <= c < 127 else f"\\x{c:02x}" for c in n)
call("create f", lambda: create("f"))
create("g")
st = os.stat(p("f"))
call("link", lambda: os.link(p("f"), p("l")))
call("symlink", lambda: os.symlink("f", p("s")))
call("mkfifo", lambda: os.mkfifo(p("p")))
call("chown to its owner", lambda: os.chown(p("f"), st.st_uid, st.st_gid))
call("chown to nobody", lambda: os.chown(p("f"), 65534, -1))
call("chgrp to nogroup", lambda: os.chown(p("f"), -1, 65534))
call("rename exchange", lambda: exchange("f", "g"))
for n in [b"a:b", b"a*b", b"a?b", b'a"b', b"a<b", b"a>b", b"a|b", b"a\\b",
          b"a\x01b", b"\xff"]:
    call("create " + show(n), lambda: create(n))
call("rename f to a:b", lambda: os.rename(p("f"), p("a:b")))
# a directory made here: in write-back it is only in the journal
call("mkdir d", lambda: os.mkdir(p("d")))
for n in [b"d/a:b", b"d/a|b"]:
    call("in d: create " + show(n[2:]), lambda: create(n))
call("in d: mkdir a*d", lambda: os.mkdir(p("d/a*d")))
call("in d: create \\xff", lambda: create(b"d/\xff"))
call("in d: link", lambda: os.link(p("f"), p("d/l")))
call("in d: symlink", lambda: os.symlink("f", p("d/s")))
def write(n, data):
    fd = os.open(p(n), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.close(fd)
call("in d: write Case", lambda: write("d/Case", b"one"))
call("in d: write case", lambda: write("d/case", b"two"))
write("d/g2", b"three")
call("in d: rename d/g2 to d/CASE", lambda: os.rename(p("d/g2"), p("d/CASE")))
for n, data in [("\u00c9t\u00e9", b"one"), ("\u00e9t\u00e9", b"two")]:
    call("in d: write " + show(n.encode()),
         lambda: write("d/" + n, data))
EOF
}

# cannot_check MODE OPTS: the calls on a mount of smb-cannot-MODE-$$
cannot_check() {
	local mode=$1 opts=$2 mnt=$W/mnt-cannot-$1 rc=0 left want
	mkdir -p "$mnt"
	"$W/ferryfs" mount "$SMB_URL/smb-cannot-$mode-$$" "$mnt" \
		-o credentials="$CRED",journal="$W/journal-cannot-$mode",cache=off,"$opts" \
		</dev/null || return 1
	cannot_calls "$mnt" >"$W/cannot-$mode.out" 2>&1
	want=CANNOT_WANT_$mode
	if ! diff -u <(printf '%s\n%s\n' "$CANNOT_WANT" "${!want}") "$W/cannot-$mode.out"; then
		echo "$mode: answers differ from CANNOT_WANT (above)"
		rc=1
	fi
	# write-back: nothing taken that the flush would have to give up
	if ! timeout 120 "$FERRYFS" flush "$mnt" --wait; then
		echo "$mode: flush --wait failed"
		rc=1
	fi
	# (.ferryfs/: the journal's marker, write-back only)
	left=$(cd "$SHARE_DIR/smb-cannot-$mode-$$" && ls -A | grep -vx .ferryfs | tr '\n' ' ')
	if [ "$left" != "d f g " ]; then
		echo "$mode: the share holds '$left', not 'd f g '"
		rc=1
	fi
	# write-through: "case" and "CASE" were Case (two, then g2 renamed
	# over it), "été" was "Été"; write-back: none of them was taken, the
	# others are as written
	left=$(cd "$SHARE_DIR/smb-cannot-$mode-$$/d" &&
		for n in $(LC_ALL=C ls -A); do printf '%s=%s ' "$n" "$(cat "$n")"; done)
	E=$(printf '\303\211t\303\251') # Été
	[ $mode = wt ] && want="Case=three $E=two " || want="Case=one g2=three $E=one "
	if [ "$left" != "$want" ]; then
		echo "$mode: the share's d holds '$left', not '$want'"
		rc=1
	fi
	fusermount3 -u "$mnt" || rc=1
	return $rc
}

for mode in wt wb; do
	[ $mode = wt ] && opts=writeback=off || opts=writeback=on
	step "$mode: what SMB cannot hold is refused at once, as the share refuses it" \
		cannot_check $mode $opts
done

# --- an rmdir over a file unlinked while open ---------------------------------

# Write-back: d/f on the share is open here (read) when d/f and d are
# removed. The flusher's unlink moves it aside (SET_ASIDE name, smb.c); its
# rmdir of d waits for the close instead of being given up for a
# "Directory not empty", and nothing is left on the share.
aside_check() {
	local mnt=$W/mnt-aside share=$SHARE_DIR/smb-aside-$$ out
	mkdir -p "$mnt"
	"$W/ferryfs" mount "$SMB_URL/smb-aside-$$" "$mnt" \
		-o credentials="$CRED",journal="$W/journal-aside",cache=off \
		</dev/null || return 1
	mkdir "$mnt/d" && echo kept >"$mnt/d/f" &&
		timeout 60 "$FERRYFS" flush "$mnt" --wait >/dev/null || return 1
	out=$(python3 - "$mnt" "$FERRYFS" <<'EOF'
import os, subprocess, sys, time
mnt = sys.argv[1]
fd = os.open(mnt + "/d/f", os.O_RDONLY)
os.unlink(mnt + "/d/f")
os.rmdir(mnt + "/d")
# the flusher gets to both while f is still open
time.sleep(2)
print(os.read(fd, 100).decode().strip(), end=" ")
os.close(fd)
r = subprocess.run([sys.argv[2], "flush", mnt, "--wait"], timeout=60,
                   stdout=subprocess.DEVNULL)
print("flush", r.returncode)
EOF
)
	[ "$out" = "kept flush 0" ] || { echo "read and flush gave '$out'"; return 1; }
	# (but the journal's marker, .ferryfs/)
	[ -z "$(ls -A "$share" | grep -vx .ferryfs)" ] || { echo "the share holds: $(ls -AR "$share")"; return 1; }
	fusermount3 -u "$mnt"
}

step "wb: an rmdir over a file unlinked while open waits for its close" \
	aside_check

# --- a dropped connection ------------------------------------------------------

# The pid of the smbd serving the TCP connection of worker process $1.
smbd_of_worker() {
	local port
	port=$(nsenter --net="$CLIENT_NETNS" ss -tnp 2>/dev/null |
		awk -v p="pid=$1," '$0 ~ p && $5 ~ /:445$/ { sub(/.*:/, "", $4); print $4; exit }')
	[ -n "$port" ] || return 1
	nsenter --net="$NAS_NETNS" ss -tnp 2>/dev/null |
		awk -v p=":$port" '$5 ~ p"$" { if (match($0, /pid=[0-9]+/)) print substr($0, RSTART + 4, RLENGTH - 4); exit }'
}

reconnect_check() {
	local mnt=$W/mnt-rc worker smbd out
	mkdir -p "$mnt"
	# write-through: every write is a call of the driver, on its one
	# connection
	"$W/ferryfs" mount "$SMB_URL/smb-reconnect-$$" "$mnt" -f \
		-o credentials="$CRED",connections=1,writeback=off \
		>"$W/rc.log" 2>&1 </dev/null &
	rc_daemon=$!
	for _ in $(seq 1 100); do
		awk -v m="$mnt" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo && break
		sleep 0.1
	done
	worker=$(pgrep -P "$rc_daemon" | head -n 1)
	smbd=${worker:+$(smbd_of_worker "$worker")}
	if [ -z "$smbd" ]; then
		echo "no worker ($worker) or smbd ($smbd) found"
		return 1
	fi
	exec 8<>"$mnt/open.txt" || return 1
	echo before >&8
	kill "$smbd"
	sleep 0.3
	echo after >&8 && echo new >"$mnt/new.txt" || { exec 8>&-; return 1; }
	exec 8>&-
	out=$(cat "$mnt/open.txt" "$mnt/new.txt" | tr '\n' ' ')
	[ "$out" = "before after new " ] || { echo "read back '$out'"; return 1; }
	cmp -s <(printf 'before\nafter\n') "$SHARE_DIR/smb-reconnect-$$/open.txt" ||
		{ echo "the share's copy differs"; return 1; }
	grep -q "connection lost" "$W/rc.log" && grep -q "connection back" "$W/rc.log" ||
		{ echo "no lost/back lines in the log"; return 1; }
	fusermount3 -u "$mnt" || return 1
	wait "$rc_daemon" || { echo "daemon exit status $?"; return 1; }
	rc_daemon=
}

if [ "$nas_down" = 1 ] || [ "${SMB_SUITE_KILL_SMBD:-0}" = 1 ]; then
	step "a dropped connection: an open file and a new one go on working" \
		reconnect_check
	[ "${summary[-1]#not ok}" = "${summary[-1]}" ] || sed 's/^/    /' "$W/rc.log"
else
	summary+=("ok - a dropped connection # SKIP nas.sh was up already: its smbd processes are not ours to kill")
fi

# --- 4. the mount runs -------------------------------------------------------------

# result NAME LOGFILE RC: one summary line from a run's log
result() {
	local name=$1 file=$2 rc=$3 tally skips
	tally=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$file" | tail -n 1)
	skips=$(grep -c '# SKIP' "$file")
	local line="$name: ${tally:-no tally} ($skips skipped, exit $rc, $4 s)"
	if [ "$rc" != 0 ]; then
		failed=1
		line+=" FAILED"
		grep -E '^not ok|giving it up' "$file" | head -n 40 |
			sed 's/^/    /' >"$W/fails.${name// /-}"
	fi
	summary+=("$line")
}

for mode in wt wb; do
	for t in syscalls programs; do
		if [ $t = syscalls ]; then
			cmd=$IT_SYSCALLS
		else
			cmd=$ROOT/tests/it/it_programs.sh
		fi
		if [ "$mode" = wt ]; then
			dir=smb-$t-$$ opts=writeback=off
		else
			dir=smb-wb-$t-$$ opts=writeback=on
		fi
		skip=$SMB_SKIP
		# write-back: as nfs_suite, a change behind the mount's back is
		# not looked for
		[ "$mode" = wb ] && skip+=,remote_writer
		log "$mode: it_$t on a mount of $SMB_URL/$dir ($opts)"
		t0=$SECONDS
		FERRYFS_REMOTE="$SMB_URL/$dir" \
			FERRYFS_REMOTE_DIR="$SHARE_DIR/$dir" \
			FERRYFS_OPTS="-o credentials=$CRED,$opts" \
			IT_SKIP_FEATURES=$skip IT_SKIP_REASON=smb \
			"$ROOT/tests/it/mount_run.sh" "$W/ferryfs" "$cmd" \
			>"$W/$mode-$t.log" 2>&1
		rc=$?
		cat "$W/$mode-$t.log"
		result "$mode it_$t" "$W/$mode-$t.log" $rc $((SECONDS - t0))
	done
done

echo
log "summary (server: $SMB_URL, skipped features: $SMB_SKIP)"
for line in "${summary[@]}"; do
	echo "  $line"
done
for f in "$W"/fails.*; do
	[ -e "$f" ] || continue
	echo "  ${f##*/fails.}:"
	cat "$f"
done
status=$failed
exit
