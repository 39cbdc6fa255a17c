#!/bin/bash
# nfs_suite.sh - ferryfs's nfs driver against a real NFS server: the CI
# entry of the NFS half of issue 4. As root:
#
#   tests/it/nfs_suite.sh FERRYFS IT_SYSCALLS [IT_NFS] [--v4] [--keep]
#   tests/it/nfs_suite.sh --serve    (step 1 only, until interrupted: a
#                                     server to try things against)
#
# FERRYFS and IT_SYSCALLS are the built binaries (ctest passes
# $<TARGET_FILE:...>), IT_NFS the driver checks (tests/it/it_nfs.c), run
# if given.
#
# 1. A server. tests/bench/nas.sh's when that script exists and works: if
#    it is up already (`nas.sh env` answers) it is used as it is and left
#    up, else `nas.sh up --rate none` and `nas.sh down` at the end; from
#    `nas.sh env` come NFS_URL_V3 (nfs://HOST/EXPORT?version=3, exported
#    without root squash), NAS_EXPORT_DIR (the export's directory here)
#    and CLIENT_NETNS (the namespace that reaches HOST; its
#    /run/netns/NAME path or NAME). Else our own, torn down at the end:
#    network
#    namespaces ffnfs-nas (10.78.0.2) and ffnfs-cli (10.78.0.1) joined by
#    a veth (nothing in the host's namespace); in ffnfs-nas, with a
#    private /run, rpcbind and nfs-ganesha (FSAL VFS, NFSv3 and NFSv4,
#    Squash = No_Root_Squash, numeric owners) exporting a temp dir as
#    /export. Missing Debian packages are installed (apt-get).
# 2. it_nfs on nfs://HOST/EXPORT/v3-driver-PID, with FERRYFS_NFS_RESTART
#    set to a command that restarts ganesha (nas.sh restart-nfs with
#    nas.sh's server: an already-up nas.sh sees its ganesha restarted).
# 3. it_syscalls and it_programs on ferryfs mounts of
#    nfs://HOST/EXPORT/<run>?version=3 (tests/it/mount_run.sh with
#    FERRYFS_REMOTE and FERRYFS_REMOTE_DIR), the daemon in the client
#    namespace (nsenter --net, which keeps the host's mount namespace, so
#    the FUSE mount is seen), with IT_SKIP_REASON=nfs and
#    IT_SKIP_FEATURES=$NFS_SKIP (below): what NFSv3 and this server cannot
#    do. Each run gets a fresh directory of the export, made before the
#    mount (a new name: the server's caches have nothing of it).
# 4. --v4: steps 2 and 3 over NFSv4 too, REPORTED ONLY: libnfs 4.0's NFSv4
#    has the limits listed at the top of remote/nfs.c, so some checks fail
#    there by design; the NFSv4 runs never fail the suite.
# 5. Teardown, whatever happened: the processes in our namespaces killed
#    by pid (ip netns pids), the namespaces deleted, the temp dir removed
#    (--keep keeps it and prints where).
#
# NFS_SUITE_SERVER=own skips nas.sh (=nas: nas.sh or fail; default auto).
#
# Exit: 0 if every NFSv3 run passed, 1 if one failed or the server did not
# come up, 77 (skip) without root, /dev/fuse, or a way to get the packages.
set -u

NFS_SKIP=xattr,fallocate,seek_hole,exchange,enospc,remote_writer,symlink_times,remote_alloc
# xattr          NFSv3 has none (no RMT_CAP_XATTR)
# fallocate      no ALLOCATE in NFSv3: -EOPNOTSUPP
# seek_hole      holes are not reported: all of a file is data
# exchange       no atomic RENAME_EXCHANGE in NFS: -EINVAL
# enospc         it_syscalls mounts a tmpfs inside REMOTE: the server
#                does not cross into it
# remote_writer  a file changed on the export behind ganesha's back keeps
#                its cached attributes
# symlink_times  ganesha does not set a symlink's own times
#                (nfs-ganesha issue #983)
# remote_alloc   write-back (the default): the journal keeps data, not
#                fallocate's allocation (tests/CMakeLists.txt FERRYFS_WB_SKIP)

NS_NAS=ffnfs-nas
NS_CLI=ffnfs-cli
IP_NAS=10.78.0.2
IP_CLI=10.78.0.1
VETH_NAS=ffnfs-n
VETH_CLI=ffnfs-c

log() { printf 'nfs_suite: %s\n' "$*"; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# our own server: nas_need_packages, nas_own_up, nas_wait, nas_own_down
# shellcheck source=nas_lib.sh
. "$ROOT/tests/it/nas_lib.sh"
v4=0
keep=0
serve=0
args=()
for a in "$@"; do
	case "$a" in
	--v4) v4=1 ;;
	--keep) keep=1 ;;
	--serve) serve=1 ;;
	-h | --help)
		sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) args+=("$a") ;;
	esac
done
if [ ${#args[@]} -lt 2 ] && [ "$serve" = 0 ]; then
	echo "usage: nfs_suite.sh FERRYFS IT_SYSCALLS [IT_NFS] [--v4] [--keep]" >&2
	echo "       nfs_suite.sh --serve" >&2
	exit 2
fi
FERRYFS=/bin/true
IT_SYSCALLS=/bin/true
IT_NFS=
[ ${#args[@]} -ge 1 ] && FERRYFS=$(readlink -f "${args[0]}")
[ ${#args[@]} -ge 2 ] && IT_SYSCALLS=$(readlink -f "${args[1]}")
[ ${#args[@]} -ge 3 ] && IT_NFS=$(readlink -f "${args[2]}")

if [ "$(id -u)" != 0 ]; then
	log "skip: needs root"
	exit 77
fi
if [ ! -c /dev/fuse ]; then
	log "skip: no /dev/fuse"
	exit 77
fi
for f in "$FERRYFS" "$IT_SYSCALLS" ${IT_NFS:+"$IT_NFS"}; do
	if [ ! -x "$f" ]; then
		log "error: '$f' is not an executable"
		exit 1
	fi
done

W=
NFS_DIR=
sleeper=    # --serve: the pid of its sleep
nas_own=0   # our own ganesha (else nas.sh's server; nas_lib.sh sets it)
nas_down=0  # we brought nas.sh up: take it down
status=1

# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
	trap - EXIT INT TERM HUP
	cd /
	[ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null
	nas_own_down
	# our run directories in nas.sh's export (ours go with $W)
	if [ "$nas_own" = 0 ] && [ "$keep" = 0 ] && [ -n "${NFS_DIR:-}" ]; then
		rm -rf "$NFS_DIR"/v[34]-driver-$$ "$NFS_DIR"/v[34]-syscalls-$$ \
			"$NFS_DIR"/v[34]-programs-$$
	fi
	if [ "$nas_down" = 1 ]; then
		"$ROOT/tests/bench/nas.sh" down >/dev/null 2>&1 ||
			log "warning: 'nas.sh down' failed"
	fi
	if [ -n "$W" ]; then
		if [ "$keep" = 1 ]; then
			log "kept $W"
		else
			rm -rf "$W"
		fi
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'status=130; exit' INT
trap 'status=143; exit' TERM HUP

# nas.sh's server, if it has one for us: sets NFS_URL, NFS_DIR, CLIENT_NETNS
nas_server() {
	local nas=$ROOT/tests/bench/nas.sh out line key val
	[ -x "$nas" ] || return 1
	if ! out=$("$nas" env 2>/dev/null); then
		log "starting tests/bench/nas.sh (up --rate none)"
		nas_down=1
		"$nas" up --rate none >"$W/nas.log" 2>&1 || {
			log "nas.sh up failed: using our own server"
			tail -n 5 "$W/nas.log"
			return 1
		}
		out=$("$nas" env 2>/dev/null) || return 1
	fi
	NFS_URL= NFS_DIR= CLIENT_NETNS=
	while IFS= read -r line; do
		line=${line#export }
		key=${line%%=*}
		val=${line#*=}
		val=${val#[\"\']}
		val=${val%[\"\']}
		case "$key" in
		NFS_URL_V3) NFS_URL=${val%%\?*} ;;
		NAS_EXPORT_DIR) NFS_DIR=$val ;;
		CLIENT_NETNS) CLIENT_NETNS=$val ;;
		esac
	done <<<"$out"
	[[ "$CLIENT_NETNS" == /* ]] || CLIENT_NETNS=/run/netns/$CLIENT_NETNS
	if [ -z "$NFS_URL" ] || [ ! -d "$NFS_DIR" ] || [ ! -e "$CLIENT_NETNS" ]; then
		log "nas.sh env gives no NFS_URL_V3/NAS_EXPORT_DIR/CLIENT_NETNS: using our own server"
		return 1
	fi
	RESTART="'$ROOT/tests/bench/nas.sh' restart-nfs"
	log "using nas.sh's server $NFS_URL (exported from $NFS_DIR)"
	return 0
}

# --- the runs -------------------------------------------------------------------

W=$(mktemp -d /tmp/ferryfs-nfs.XXXXXX) || exit 1
chmod 0755 "$W"

server=${NFS_SUITE_SERVER:-auto}
if [ "$server" = own ] || ! nas_server; then
	if [ "$server" = nas ]; then
		log "error: NFS_SUITE_SERVER=nas but nas.sh gives no server"
		exit
	fi
	if [ "$nas_down" = 1 ]; then
		"$ROOT/tests/bench/nas.sh" down >/dev/null 2>&1
		nas_down=0
	fi
	if ! nas_need_packages; then
		log "skip: cannot install nfs-ganesha, nfs-ganesha-vfs, rpcbind"
		status=77
		exit
	fi
	nas_own_up || exit
fi

if [ "$serve" = 1 ]; then
	nas_wait || exit
	log "serving $NFS_URL (?version=3 or 4), exported from $NFS_DIR;"
	log "clients in: nsenter --net=$CLIENT_NETNS${RESTART:+; restart: $RESTART}"
	log "interrupt (Ctrl-C) to stop"
	status=0
	while :; do
		sleep 3600 &
		sleeper=$!
		wait $sleeper # a trap runs at once, unlike during a plain sleep
	done
fi

runs=(v3)
[ "$v4" = 1 ] && runs+=(v4)
for v in "${runs[@]}"; do
	for name in driver syscalls programs; do
		mkdir -m 0755 "$NFS_DIR/$v-$name-$$" || exit
	done
done
nas_wait || exit

# For sanitizer builds: libnfs 4.0's nfs4_set_client_name() drops the name
# it had (a few bytes per NFSv4 connection, remote/nfs.c sets its own)
printf 'leak:nfs4_set_client_name\n' >"$W/lsan.supp"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$W/lsan.supp"

# a ferryfs that runs in the client namespace (nsenter execs it: same pid)
cat >"$W/ferryfs" <<EOF
#!/bin/sh
exec nsenter --net=$CLIENT_NETNS "$FERRYFS" "\$@"
EOF
chmod +x "$W/ferryfs"

summary=()
failed=0

# result NAME LOGFILE RC GATING: one summary line from a run's log
result() {
	local name=$1 file=$2 rc=$3 gating=$4 tally skips
	tally=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$file" | tail -n 1)
	[ -z "$tally" ] && tally=$(grep -E '^\[  (PASSED|FAILED)  \]' "$file" | tr '\n' ' ')
	skips=$(grep -c '# SKIP\|^\[  SKIPPED \]' "$file")
	local line="$name: ${tally:-no tally} ($skips skipped, exit $rc, $((SECONDS - t0)) s)"
	if [ "$rc" != 0 ]; then
		if [ "$gating" = 1 ]; then
			failed=1
			line+=" FAILED"
		else
			line+=" (reported only)"
		fi
		grep -E '^not ok|^\[  (FAILED|ERROR)' "$file" | head -n 40 |
			sed 's/^/    /' >"$W/fails.$name"
	fi
	summary+=("$line")
}

for v in "${runs[@]}"; do
	gating=0
	[ "$v" = v3 ] && gating=1
	query="?version=${v#v}"
	if [ -n "$IT_NFS" ]; then
		log "$v: it_nfs"
		t0=$SECONDS
		FERRYFS_NFS_URL="$NFS_URL/$v-driver-$$$query" \
			FERRYFS_NFS_DIR="$NFS_DIR/$v-driver-$$" \
			FERRYFS_NFS_RESTART="$RESTART" \
			timeout -k 10 600 nsenter --net="$CLIENT_NETNS" \
			"$IT_NFS" >"$W/$v-driver.log" 2>&1
		rc=$?
		cat "$W/$v-driver.log"
		result "$v it_nfs" "$W/$v-driver.log" $rc $gating
		nas_wait || exit # it may have restarted the server
	fi
	for t in syscalls programs; do
		if [ $t = syscalls ]; then
			cmd=$IT_SYSCALLS
		else
			cmd=$ROOT/tests/it/it_programs.sh
		fi
		log "$v: it_$t on a mount of $NFS_URL/$v-$t-$$$query"
		t0=$SECONDS
		FERRYFS_REMOTE="$NFS_URL/$v-$t-$$$query" \
			FERRYFS_REMOTE_DIR="$NFS_DIR/$v-$t-$$" \
			IT_SKIP_FEATURES=$NFS_SKIP IT_SKIP_REASON=nfs \
			"$ROOT/tests/it/mount_run.sh" "$W/ferryfs" "$cmd" \
			>"$W/$v-$t.log" 2>&1
		rc=$?
		cat "$W/$v-$t.log"
		result "$v it_$t" "$W/$v-$t.log" $rc $gating
	done
done

echo
log "summary (server: $NFS_URL, skipped features: $NFS_SKIP)"
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
