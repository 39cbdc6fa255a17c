#!/bin/bash
# run.sh — issue 4's benchmark table: ferryfs against the tools a user has
# today, over the NAS of tests/bench/nas.sh. See tests/bench/README-bench.md.
#
#   sudo tests/bench/run.sh [--rate 1gbit|10gbit|RATE|none] [--flow-cap RATE|none]
#                           [--delay-ms MS] [--runs N] [--quick] [--rows LIST]
#                           [--workloads LIST] [--append]
#
# Workloads (sources on /dev/shm, pulls written to /var/tmp):
#   big    one 1 GiB file            (--quick: 64 MiB)
#   four   4 x 256 MiB files         (--quick: 4 x 16 MiB)
#   tree   10,000 files of 1-16 KiB in 100 directories (--quick: 500 files)
# --workloads picks workloads (comma-separated; default big,four,tree).
# Rows (--rows picks groups, comma-separated; default all):
#   iperf         iperf3 -P1 and -P4, both directions: the link (always run)
#   nfs-cp        libnfs nfs-cp push and pull, NFSv3, one file per call
#   smbclient     smbclient mput / mget (recurse)
#   sshfs         cp -r to / from an sshfs mount (sshd in the NAS namespace)
#   rclone-copy   rclone copy --transfers 4, smb backend, push and pull
#   rclone-mount  rclone mount --vfs-cache-mode writes (smb): cp, and until
#                 the data is on the NAS
#   ferryfs-nfs   ferryfs on nfs://: cp, until flush --wait returns, cold read;
#                 and cp to local disk, what ferryfs's cp compares with
#   ferryfs-smb   ferryfs on smb://: the same ("n/a" without the smb driver)
#   ferryfs-nfs-pt  ferryfs on nfs:// with -o passthrough (fs/pt.c): cp,
#                 until flush --wait returns, cold read (not by default)
#   ferryfs-smb-pt  the same on smb:// (not by default)
#   ferryfs-smb-drain, ferryfs-nfs-drain  the flush alone: cp into the
#                 mount with the flush paused (ferryfs pause), then the
#                 time from ferryfs resume until flush --wait returns: the
#                 journal's drain, what "ferryfs's flush" is without the cp
#                 before it (not by default)
#   ferryfs-agent ferryfs on nfs:// flushing through ferry-agent, which this
#                 script runs in the NAS namespace over the export directory
#                 (port 7077): cp, until flush --wait returns
#   ferryfs-smb-agent  ferryfs on smb:// flushing through a ferry-agent
#                 over the share's directory (port 7078): the same
# Each figure is the median of --runs (3) runs; its ratio is the time the
# link needs for the same bytes (size / iperf3 -P4 rate of that direction,
# measured in the same run) over the figure: 1.00 = the link's speed.
# Every write is checked by SHA-256 on the NAS side, every pull locally.
#
# --rate, --flow-cap, --delay-ms are passed to nas.sh up (only when they
# differ from what runs); the previous settings are restored at the end, and
# a NAS this script brought up is taken down. With --delay-ms every client
# goes through the delay line (10.77.0.3), otherwise straight to 10.77.0.1.
# --append adds the table to tests/bench/RESULTS.md.
# Environment: FERRYFS=<binary> (default: build/fs/ferryfs, built if missing)
#   BUILD_DIR=build  BENCH_PARENT=/var/tmp  SSH_PORT=2222  STREAMS=4
#   NO_READ=1 skips the cold-read rows of ferryfs (slow through a delay)
#   KEEP_WORK=1 keeps the work directory (the logs of every mount and tool)
#   PREFAULT_MB=8192: after every drop of the page cache, that much memory
#   is written once (in /dev/shm, then freed): on this VM the first touch
#   of memory its host took back costs ~3x, which would fall on whichever
#   row runs first (a `cp` to local disk took 0.25 s or 2 s); 0 turns it off
#   PAGE_REPORTING=keep: leave the VM's free page reporting on. By default,
#   where /sys/module/page_reporting exists, the run sets its order above
#   the largest (no free memory is handed back to the host) and restores it
#   at exit: the prefault's freed memory was reported in 2 s cycles, and
#   each cycle held every fdatasync on the machine 60-250 ms (the journal's
#   claims: ferryfs's streams stalled together), which a NAS client that is
#   not a VM does not see. Every row runs under the same setting.
set -euo pipefail
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# drop_caches; run.sh's own die and median below take the place of lib.sh's
. "$HERE/lib.sh"
ROOT=$(cd "$HERE/../.." && pwd)
PROG=run.sh
NAS_SH=$HERE/nas.sh
RESULTS=$HERE/RESULTS.md
CMDLINE="tests/bench/run.sh $*"

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}
usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	exit "${1:-0}"
}

ALL_GROUPS=(iperf nfs-cp smbclient sshfs rclone-copy rclone-mount ferryfs-nfs ferryfs-smb ferryfs-agent ferryfs-smb-agent ferryfs-nfs-pt ferryfs-smb-pt ferryfs-smb-drain ferryfs-nfs-drain)
OPT_RATE='' OPT_CAP='' OPT_DELAY='' OPT_WLS='' RUNS=3 QUICK=0 ROWS='' APPEND=0
while (($#)); do
	case $1 in
	--rate | --flow-cap | --delay-ms | --runs | --rows | --workloads)
		(($# >= 2)) || die "$1 needs a value"
		case $1 in
		--rate) OPT_RATE=$2 ;;
		--flow-cap) OPT_CAP=$2 ;;
		--delay-ms)
			[[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad --delay-ms '$2'"
			OPT_DELAY=$2
			;;
		--runs)
			[[ $2 =~ ^[1-9][0-9]*$ ]] || die "bad --runs '$2'"
			RUNS=$2
			;;
		--rows) ROWS=$2 ;;
		--workloads) OPT_WLS=$2 ;;
		esac
		shift 2
		;;
	--quick)
		QUICK=1
		shift
		;;
	--append)
		APPEND=1
		shift
		;;
	-h | --help) usage 0 ;;
	*) die "unknown option '$1' (try --help)" ;;
	esac
done
((QUICK)) && [[ $CMDLINE != *--runs* ]] && RUNS=1
declare -A WANT=()
if [[ -z $ROWS ]]; then
	for g in "${ALL_GROUPS[@]}"; do
		[[ $g == ferryfs-*-pt || $g == ferryfs-*-drain ]] || WANT[$g]=1 # asked by name
	done
else
	IFS=, read -r -a picked <<<"$ROWS"
	for g in "${picked[@]}"; do
		[[ " ${ALL_GROUPS[*]} " == *" $g "* ]] || die "unknown row group '$g' (${ALL_GROUPS[*]})"
		WANT[$g]=1
	done
	WANT[iperf]=1 # the link is needed for every ratio
fi
want() { [[ -n ${WANT[$1]:-} ]]; }
# the row of a cp to local disk goes with any ferryfs row (g_ferry)
for g in "${!WANT[@]}"; do [[ $g != ferryfs-* ]] || WANT[local]=1; done

((EUID == 0)) || die "needs root (namespaces, mounts, drop_caches): sudo $0"

# --- sizes ---------------------------------------------------------------------
if ((QUICK)); then
	BIG_MB=64 FOUR_MB=16 TREE_N=500 IPERF_T=1
else
	BIG_MB=1024 FOUR_MB=256 TREE_N=10000 IPERF_T=3
fi
WLS=(big four tree)
if [[ -n $OPT_WLS ]]; then
	IFS=, read -r -a WLS <<<"$OPT_WLS"
	for w in "${WLS[@]}"; do
		[[ $w == big || $w == four || $w == tree ]] || die "unknown workload '$w'"
	done
fi
declare -A WL_LABEL=(
	[big]="$( ((BIG_MB >= 1024)) && echo "$((BIG_MB / 1024)) GiB" || echo "$BIG_MB MiB")"
	[four]="4 x $FOUR_MB MiB"
	[tree]="$(sed ':a; s/\B[0-9]\{3\}\>/,&/; ta' <<<"$TREE_N") files"
)
declare -A WL_BYTES=() WL_FILES=()
STREAMS=${STREAMS:-4}
NO_READ=${NO_READ:-}
PREFAULT_MB=${PREFAULT_MB:-8192}
PAGE_REPORTING=${PAGE_REPORTING:-hold}
PR_PARAM=/sys/module/page_reporting/parameters/page_reporting_order
PR_OLD='' PR_SET=''
SSH_PORT=${SSH_PORT:-2222}
RC_PORT=5572

# --- tools ---------------------------------------------------------------------
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
FERRYFS=${FERRYFS:-$BUILD_DIR/fs/ferryfs}
if [[ ! -x $FERRYFS ]]; then
	say "building $FERRYFS"
	[[ -f $BUILD_DIR/CMakeCache.txt ]] || cmake -S "$ROOT" -B "$BUILD_DIR" -DFERRYFS_WERROR=ON >/dev/null
	cmake --build "$BUILD_DIR" --target ferryfs -j"$(nproc)" >/dev/null
fi
FERRYFS=$(realpath "$FERRYFS")
AGENT=${AGENT:-$(dirname "$(dirname "$FERRYFS")")/agent/ferry-agent}
if [[ ! -x $AGENT && -f $BUILD_DIR/CMakeCache.txt ]]; then
	cmake --build "$BUILD_DIR" --target ferry-agent -j"$(nproc)" >/dev/null
fi

# nas.sh installs the NAS's packages; these are the clients it does not have
PACKAGES=(rclone sshfs openssh-server openssh-client libnfs-utils smbclient iperf3 jq)
missing=()
for p in "${PACKAGES[@]}"; do
	[[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] || missing+=("$p")
done
if ((${#missing[@]})); then
	say "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	aopts=(-q -y --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
	apt-get install "${aopts[@]}" "${missing[@]}" </dev/null >&2 ||
		{ apt-get -q update >&2 && apt-get install "${aopts[@]}" "${missing[@]}" </dev/null >&2; }
fi
for t in nfs-cp smbclient rclone sshfs /usr/sbin/sshd ssh-keygen iperf3 jq python3 fusermount3 perl sha256sum; do
	command -v "$t" >/dev/null || die "'$t' not found"
done

# --- state for cleanup -----------------------------------------------------------
WORK='' SHM='' NAS_WAS_UP=0 NAS_BROUGHT_UP=0 NAS_CHANGED=0 PREV_RATE='' PREV_CAP='' PREV_DELAY=''
RUN_SSHD_DIR=0 HELPER='' BENCH_ID=''
declare -A PIDS=()  # name -> pid of a process we started (killed at exit)
declare -A MOUNTS=() # mountpoint -> pid of its daemon (unmounted at exit)

is_mounted() { awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

# unmount MNT: fusermount3 -u (retried), lazy as a last resort; wait for its daemon
unmount() {
	local m=$1 pid=${MOUNTS[$1]:-} i
	if is_mounted "$m"; then
		for ((i = 0; i < 40; i++)); do
			fusermount3 -u "$m" 2>/dev/null && break
			sleep 0.25
		done
		is_mounted "$m" && fusermount3 -uz "$m" 2>/dev/null
	fi
	if [[ -n $pid ]]; then
		for ((i = 0; i < 100; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null || true
	fi
	unset "MOUNTS[$m]"
	return 0
}

stop_pid() {
	local name=$1 pid=${PIDS[$1]:-} i
	[[ -n $pid ]] || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	unset "PIDS[$name]"
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$? m n
	trap - EXIT INT TERM
	set +e
	for m in "${!MOUNTS[@]}"; do
		[[ $m == "$HELPER" ]] || unmount "$m"
	done
	if [[ -n $HELPER && -n $BENCH_ID ]] && is_mounted "$HELPER"; then
		rm -rf "${HELPER:?}/$BENCH_ID"
	fi
	[[ -n $HELPER ]] && unmount "$HELPER"
	for n in "${!PIDS[@]}"; do stop_pid "$n"; done
	((RUN_SSHD_DIR)) && rmdir /run/sshd 2>/dev/null
	if [[ -n $BENCH_ID && -n ${NAS_SHARE_DIR:-} ]]; then
		rm -rf "${NAS_SHARE_DIR:?}/$BENCH_ID"
	fi
	[[ -n $WORK && -z ${KEEP_WORK:-} ]] && rm -rf "$WORK"
	[[ -n $SHM ]] && rm -rf "$SHM"
	[[ -n $PR_OLD ]] && echo "$PR_OLD" >"$PR_PARAM"
	if ((NAS_BROUGHT_UP)); then
		say "nas.sh down (this run brought it up)"
		"$NAS_SH" down >/dev/null 2>&1
	elif ((NAS_CHANGED)); then
		say "restoring nas.sh: --rate $PREV_RATE --flow-cap $PREV_CAP --delay-ms $PREV_DELAY"
		"$NAS_SH" up --rate "$PREV_RATE" --flow-cap "$PREV_CAP" --delay-ms "$PREV_DELAY" >/dev/null 2>&1 ||
			say "warning: could not restore the nas.sh settings"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [[ $PAGE_REPORTING != keep && -w $PR_PARAM ]]; then
	PR_OLD=$(cat "$PR_PARAM")
	PR_SET=
	# the highest order the kernel takes: above MAX_PAGE_ORDER (10 on
	# x86-64) no free block is ever reported (6.18 takes 11, not 64)
	for v in 16 15 14 13 12 11; do
		if (echo "$v" >"$PR_PARAM") 2>/dev/null; then PR_SET=$v && break; fi
	done
	if [[ -z $PR_SET ]]; then
		say "warning: the VM's free page reporting stays on (its order cannot be raised above 10)"
		PR_OLD=
	fi
fi

# --- the NAS ----------------------------------------------------------------------
if env_out=$("$NAS_SH" env 2>/dev/null); then
	NAS_WAS_UP=1
	eval "$env_out"
	PREV_RATE=$NAS_RATE PREV_CAP=$NAS_FLOW_CAP PREV_DELAY=$NAS_DELAY_MS
fi
up_args=()
[[ -n $OPT_RATE && $OPT_RATE != "${PREV_RATE:-}" ]] && up_args+=(--rate "$OPT_RATE")
[[ -n $OPT_CAP && $OPT_CAP != "${PREV_CAP:-}" ]] && up_args+=(--flow-cap "$OPT_CAP")
[[ -n $OPT_DELAY && $OPT_DELAY != "${PREV_DELAY:-}" ]] && up_args+=(--delay-ms "$OPT_DELAY")
if ((!NAS_WAS_UP)); then
	say "nas.sh up ${up_args[*]}"
	NAS_BROUGHT_UP=1
	"$NAS_SH" up "${up_args[@]}" >/dev/null
elif ((${#up_args[@]})); then
	say "nas.sh up ${up_args[*]} (was: rate $PREV_RATE, flow cap $PREV_CAP, delay $PREV_DELAY ms)"
	NAS_CHANGED=1
	"$NAS_SH" up "${up_args[@]}" >/dev/null
fi
eval "$("$NAS_SH" env)"
if [[ -n $OPT_DELAY ]]; then
	HOST=$NAS_DELAY_IP
	NFS_BASE=${NFS_URL_V3_DELAY%%\?*}
else
	HOST=$NAS_IP
	NFS_BASE=${NFS_URL_V3%%\?*}
fi
CLI=(nsenter --net="$CLIENT_NETNS" --)
SMB_PW=$(sed -n 's/^password=//p' "$SMB_CRED_FILE")
SMB_USER=$(sed -n 's/^username=//p' "$SMB_CRED_FILE")

BENCH_PARENT=${BENCH_PARENT:-/var/tmp}
WORK=$(mktemp -d "$BENCH_PARENT/ferry-bench.XXXXXX")
SHM=$(mktemp -d /dev/shm/ferry-bench.XXXXXX)
BENCH_ID=ferry-bench-$(basename "$WORK" | sed 's/.*\.//')
LOGS=$WORK/log
mkdir -p "$LOGS" "$WORK/mnt"
MNT=$WORK/mnt
mkdir -m 0777 "$NAS_SHARE_DIR/$BENCH_ID"

need_mb=$((BIG_MB * 3 + FOUR_MB * 12 + 2000))
free_mb=$(df -Pm "$WORK" | awk 'NR == 2 { print $4 }')
((free_mb > need_mb)) || die "need ~$need_mb MB free under $BENCH_PARENT"

# --- sources --------------------------------------------------------------------------
say "making the sources in $SHM"
mkdir -p "$SHM/big" "$SHM/four"
head -c $((BIG_MB << 20)) /dev/urandom >"$SHM/big/big.bin"
for i in 1 2 3 4; do head -c $((FOUR_MB << 20)) /dev/urandom >"$SHM/four/part$i.bin"; done
make_tree "$SHM/tree" "$TREE_N" 100
for w in "${WLS[@]}"; do
	(cd "$SHM/$w" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$SHM/$w.sha256"
	WL_FILES[$w]=$(wc -l <"$SHM/$w.sha256")
	WL_BYTES[$w]=$(find "$SHM/$w" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
done

# --- results --------------------------------------------------------------------------
declare -A VALS=() CPUS=() FAILS=() NA_CELLS=() LOCAL_DONE=()
ROW_ORDER=()
declare -A ROW_LABEL=() ROW_DIR=()
row() { # ID DIR(push|pull) LABEL
	ROW_ORDER+=("$1")
	ROW_DIR[$1]=$2
	ROW_LABEL[$1]=$3
}
res() { # ROW WL SECONDS [CPU-SECONDS]
	VALS["$1|$2"]+="$3 "
	[[ -z ${4:-} ]] || CPUS["$1|$2"]+="$4 "
	say "$1 $2: $3 s${4:+, $4 cpu-s}"
}
fail() {
	FAILS["$1|$2"]+="run $RUN: $3; "
	say "FAIL $1 $2 run $RUN: $3"
}
na() { NA_CELLS["$1|$2"]=$3; }

lastlog() { tail -n 2 "$1" 2>/dev/null | tr '\n' ' ' | cut -c1-160; }

# The busy time of every CPU of the machine (client, ferryfs, the NAS's
# servers: they share it here), in jiffies (USER_HZ), from /proc/stat.
cpu_jiffies() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
cpu_since() { awk -v a="$1" -v b="$(cpu_jiffies)" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (b - a) / hz }'; }

# timed LOG CMD...: T = wall seconds of CMD, C = busy CPU-seconds of the
# machine meanwhile; fails if CMD fails
T='' C=''
timed() {
	local log=$1 t0 c0
	shift
	c0=$(cpu_jiffies)
	t0=$(now)
	"$@" >>"$log" 2>&1 || return 1
	T=$(secs "$t0" "$(now)")
	C=$(cpu_since "$c0")
}

# verify DIR WL: DIR holds exactly WL's files, each with its SHA-256
verify() {
	local n
	[[ -d $1 ]] || return 1
	n=$(find "$1" -type f | wc -l)
	[[ $n == "${WL_FILES[$2]}" ]] || {
		echo "verify: $n files in $1, expected ${WL_FILES[$2]}"
		return 1
	}
	(cd "$1" && sha256sum --quiet --strict -c "$SHM/$2.sha256") 2>&1 | head -3
	return "${PIPESTATUS[0]}"
}
# check ROW WL DIR: verify, recording a failure
check() {
	local out
	if out=$(verify "$3" "$2" 2>&1); then return 0; fi
	fail "$1" "$2" "SHA-256 check of $3 failed: $(echo "$out" | head -2 | tr '\n' ' ')"
	return 1
}

# MNT PID: until MNT is a mount that answers (its daemon may open its
# connections after the mount appears: FUSE holds every call until the
# daemon answers INIT, which would fall on the timed cp); fails if PID exits
wait_mounted() {
	local i
	for ((i = 0; i < 300; i++)); do
		is_mounted "$1" && timeout 30 stat "$1" >/dev/null 2>&1 && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# --- helpers on the NAS side --------------------------------------------------------
# A write-through ferryfs mount of the export root: mkdir and rm on the NFS
# side go through NFS (ganesha caches directories; see README-nas.md).
HELPER=$WORK/helper
mkdir -p "$HELPER"
"${CLI[@]}" "$FERRYFS" mount "${NFS_URL_V3}" "$HELPER" -f -o writeback=off >"$LOGS/helper.log" 2>&1 &
MOUNTS[$HELPER]=$!
wait_mounted "$HELPER" "${MOUNTS[$HELPER]}" || die "helper mount of $NFS_URL_V3 failed: $(lastlog "$LOGS/helper.log")"
mkdir "$HELPER/$BENCH_ID"

nfs_mkdir() { mkdir -p "$HELPER/$BENCH_ID/$1"; } # a dir on the export
nfs_rm() { rm -rf "${HELPER:?}/$BENCH_ID/$1"; }
smb_mkdir() { mkdir -m 0777 "$NAS_SHARE_DIR/$BENCH_ID/$1"; }
smb_rm() { rm -rf "${NAS_SHARE_DIR:?}/$BENCH_ID/$1"; }
local_dir() { # a fresh local pull destination
	rm -rf "$WORK/pull"
	mkdir -p "$WORK/pull"
	echo "$WORK/pull"
}

# --- iperf3 ----------------------------------------------------------------------------
row iperf-p1 push "iperf3 -P1 (client to NAS)"
row iperf-p4 push "iperf3 -P4 (client to NAS): the link for push rows"
row iperf-p1r pull "iperf3 -P1 -R (NAS to client)"
row iperf-p4r pull "iperf3 -P4 -R (NAS to client): the link for pull rows"
declare -A IPERF=() # row -> "gbit gbit ..."
g_iperf() {
	local id p r out v
	for id in iperf-p1 iperf-p4 iperf-p1r iperf-p4r; do
		p=1 r=()
		[[ $id == iperf-p4* ]] && p=4
		[[ $id == *r ]] && r=(-R)
		if out=$("${CLI[@]}" iperf3 -c "$HOST" -t "$IPERF_T" -P "$p" "${r[@]}" -J 2>&1) &&
			v=$(jq -e '.end.sum_received.bits_per_second / 1e9' <<<"$out"); then
			IPERF[$id]+="$v "
		else
			FAILS["$id|big"]+="run $RUN: iperf3 failed; "
		fi
		sleep 0.5
	done
}

# --- nfs-cp ---------------------------------------------------------------------------------
row nfscp-push push "nfs-cp push (libnfs, NFSv3, one file per call)"
row nfscp-pull pull "nfs-cp pull"
g_nfscp() {
	local w=$1
	local d=nfscp-r$RUN-$w log=$LOGS/nfscp.log f dst t0 c0 ok
	if [[ $w == tree ]]; then
		na nfscp-push tree "n/a (nfs-cp copies one file and cannot mkdir)"
		na nfscp-pull tree "n/a (nfs-cp copies one file and cannot mkdir)"
		return 0
	fi
	nfs_mkdir "$d"
	drop_caches
	c0=$(cpu_jiffies)
	t0=$(now)
	for f in "$SHM/$w"/*; do
		"${CLI[@]}" nfs-cp "$f" "$NFS_BASE/$BENCH_ID/$d/$(basename "$f")?version=3" >>"$log" 2>&1 ||
			{ fail nfscp-push "$w" "nfs-cp exit $? ($(lastlog "$log"))" && return 0; }
	done
	T=$(secs "$t0" "$(now)")
	C=$(cpu_since "$c0")
	check nfscp-push "$w" "$NAS_EXPORT_DIR/$BENCH_ID/$d" && res nfscp-push "$w" "$T" "$C"
	dst=$(local_dir)
	drop_caches
	c0=$(cpu_jiffies)
	t0=$(now) ok=1
	for f in "$SHM/$w"/*; do
		f=$(basename "$f")
		"${CLI[@]}" nfs-cp "$NFS_BASE/$BENCH_ID/$d/$f?version=3" "$dst/$f" >>"$log" 2>&1 || {
			fail nfscp-pull "$w" "nfs-cp exit $? ($(lastlog "$log"))"
			ok=0
			break
		}
	done
	T=$(secs "$t0" "$(now)")
	C=$(cpu_since "$c0")
	if ((ok)) && check nfscp-pull "$w" "$dst"; then res nfscp-pull "$w" "$T" "$C"; fi
	nfs_rm "$d"
	rm -rf "$dst"
}

# --- smbclient ------------------------------------------------------------------------------
row smb-put push "smbclient put (mput, recurse)"
row smb-get pull "smbclient get (mget, recurse)"
g_smbclient() {
	local w=$1
	local d=smbclient-r$RUN-$w log=$LOGS/smbclient.log dst
	smb_mkdir "$d"
	drop_caches
	if timed "$log" "${CLI[@]}" smbclient "//$HOST/nas" -A "$SMB_CRED_FILE" \
		-c "cd $BENCH_ID/$d; lcd $SHM/$w; prompt OFF; recurse ON; mput *"; then
		check smb-put "$w" "$NAS_SHARE_DIR/$BENCH_ID/$d" && res smb-put "$w" "$T" "$C"
	else
		fail smb-put "$w" "smbclient failed ($(lastlog "$log"))"
	fi
	dst=$(local_dir)
	drop_caches
	if timed "$log" "${CLI[@]}" smbclient "//$HOST/nas" -A "$SMB_CRED_FILE" \
		-c "cd $BENCH_ID/$d; lcd $dst; prompt OFF; recurse ON; mget *"; then
		check smb-get "$w" "$dst" && res smb-get "$w" "$T" "$C"
	else
		fail smb-get "$w" "smbclient failed ($(lastlog "$log"))"
	fi
	smb_rm "$d"
	rm -rf "$dst"
}

# --- sshfs -----------------------------------------------------------------------------------------
row sshfs-push push "sshfs: cp -r to the mount"
row sshfs-pull pull "sshfs: cp -r from a fresh mount"
SSH_HOST=$HOST
sshd_up() {
	local s=$WORK/ssh p
	mkdir -p "$s"
	ssh-keygen -q -t ed25519 -N '' -f "$s/host_key"
	ssh-keygen -q -t ed25519 -N '' -f "$s/client_key"
	cp "$s/client_key.pub" "$s/authorized_keys"
	for ((p = SSH_PORT; p < SSH_PORT + 20; p++)); do
		[[ -z $("${CLI[@]}" ss -Hltn "sport = :$p") ]] &&
			[[ -z $(nsenter --net="$NAS_NETNS" -- ss -Hltn "sport = :$p") ]] && break
	done
	SSH_PORT=$p
	cat >"$s/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress $NAS_IP
HostKey $s/host_key
AuthorizedKeysFile $s/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
LogLevel ERROR
Subsystem sftp internal-sftp
EOF
	if [[ ! -d /run/sshd ]]; then
		mkdir -m 0755 /run/sshd
		RUN_SSHD_DIR=1
	fi
	nsenter --net="$NAS_NETNS" -- /usr/sbin/sshd -D -e -f "$s/sshd_config" >>"$LOGS/sshd.log" 2>&1 &
	PIDS[sshd]=$!
	if [[ -n $OPT_DELAY ]]; then
		# the delay line of nas.sh does not relay ssh: a second one, ours
		"${CLI[@]}" "$NAS_RUN_DIR/delayline" -d "$OPT_DELAY" -b 64 \
			"$NAS_DELAY_IP:$SSH_PORT=$NAS_IP:$SSH_PORT" >>"$LOGS/delayline-ssh.log" 2>&1 &
		PIDS[delayline-ssh]=$!
	fi
	for ((p = 0; p < 50; p++)); do
		[[ -n $("${CLI[@]}" ss -Hltn "sport = :$SSH_PORT" 2>/dev/null) || -z $OPT_DELAY ]] &&
			[[ -n $(nsenter --net="$NAS_NETNS" -- ss -Hltn "sport = :$SSH_PORT") ]] && return 0
		sleep 0.1
	done
	die "sshd did not start: $(lastlog "$LOGS/sshd.log")"
}
sshfs_mount() { # REMOTE_DIR
	"${CLI[@]}" sshfs -f "root@$SSH_HOST:$1" "$MNT" -p "$SSH_PORT" \
		-o IdentityFile="$WORK/ssh/client_key" -o StrictHostKeyChecking=no \
		-o UserKnownHostsFile=/dev/null -o BatchMode=yes >>"$LOGS/sshfs.log" 2>&1 &
	MOUNTS[$MNT]=$!
	wait_mounted "$MNT" "${MOUNTS[$MNT]}"
}
g_sshfs() {
	local w=$1
	local d=sshfs-r$RUN-$w dst
	smb_mkdir "$d"
	drop_caches
	if ! sshfs_mount "$NAS_SHARE_DIR/$BENCH_ID/$d"; then
		fail sshfs-push "$w" "sshfs mount failed ($(lastlog "$LOGS/sshfs.log"))"
		unmount "$MNT"
		return 0
	fi
	if timed "$LOGS/sshfs.log" cp -r "$SHM/$w/." "$MNT/"; then
		unmount "$MNT"
		check sshfs-push "$w" "$NAS_SHARE_DIR/$BENCH_ID/$d" && res sshfs-push "$w" "$T" "$C"
	else
		fail sshfs-push "$w" "cp failed ($(lastlog "$LOGS/sshfs.log"))"
		unmount "$MNT"
	fi
	dst=$(local_dir)
	drop_caches
	if sshfs_mount "$NAS_SHARE_DIR/$BENCH_ID/$d" && timed "$LOGS/sshfs.log" cp -r "$MNT/." "$dst/"; then
		check sshfs-pull "$w" "$dst" && res sshfs-pull "$w" "$T" "$C"
	else
		fail sshfs-pull "$w" "sshfs mount or cp failed ($(lastlog "$LOGS/sshfs.log"))"
	fi
	unmount "$MNT"
	smb_rm "$d"
	rm -rf "$dst"
}

# --- rclone (smb backend) --------------------------------------------------------------------
row rclone-push push "rclone copy --transfers 4 (smb) push"
row rclone-pull pull "rclone copy --transfers 4 (smb) pull"
row rmount-cp push "rclone mount --vfs-cache-mode writes (smb): cp -r"
row rmount-nas push "rclone mount --vfs-cache-mode writes (smb): until on the NAS (from the start of cp; default --vfs-write-back 5s)"
rclone_env() {
	: >"$WORK/rclone.conf"
	export RCLONE_CONFIG=$WORK/rclone.conf
	export RCLONE_CONFIG_NASSMB_TYPE=smb
	export RCLONE_CONFIG_NASSMB_HOST=$HOST
	export RCLONE_CONFIG_NASSMB_USER=$SMB_USER
	export RCLONE_CONFIG_NASSMB_DOMAIN=WORKGROUP
	RCLONE_CONFIG_NASSMB_PASS=$(rclone obscure "$SMB_PW")
	export RCLONE_CONFIG_NASSMB_PASS
	# the smb backend targets a subdirectory of the share, never its root
	RREM=nassmb:nas/$BENCH_ID
}
g_rclone_copy() {
	local w=$1
	local d=rclone-r$RUN-$w log=$LOGS/rclone.log dst
	smb_mkdir "$d"
	drop_caches
	if timed "$log" "${CLI[@]}" rclone copy --transfers 4 "$SHM/$w" "$RREM/$d"; then
		check rclone-push "$w" "$NAS_SHARE_DIR/$BENCH_ID/$d" && res rclone-push "$w" "$T" "$C"
	else
		fail rclone-push "$w" "rclone failed ($(lastlog "$log"))"
	fi
	dst=$(local_dir)
	drop_caches
	if timed "$log" "${CLI[@]}" rclone copy --transfers 4 "$RREM/$d" "$dst"; then
		check rclone-pull "$w" "$dst" && res rclone-pull "$w" "$T" "$C"
	else
		fail rclone-pull "$w" "rclone failed ($(lastlog "$log"))"
	fi
	smb_rm "$d"
	rm -rf "$dst"
}
# Wait until the mount's VFS cache has no upload queued or in progress
# (its rc vfs/stats, asked every 0.1 s for 10 min at most), and print what
# was pending last. One process asks: starting `rclone rc` 10 times a
# second cost more CPU than the mount it asked (~35 ms a start here).
rmount_wait() {
	"${CLI[@]}" python3 -c '
import json, sys, time, urllib.request
n = "x"
for _ in range(6000):
    try:
        req = urllib.request.Request(sys.argv[1], data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        c = json.load(urllib.request.urlopen(req, timeout=5))["diskCache"]
        n = c["uploadsInProgress"] + c["uploadsQueued"]
    except Exception:
        n = "x"
    if n == 0:
        break
    time.sleep(0.1)
print(n)' "http://127.0.0.1:$RC_PORT/vfs/stats"
}
g_rclone_mount() {
	local w=$1
	local d=rmount-r$RUN-$w log=$LOGS/rclone-mount.log t0 t1 c0 c1 n
	smb_mkdir "$d"
	rm -rf "$WORK/rclone-cache"
	drop_caches
	"${CLI[@]}" rclone mount "$RREM/$d" "$MNT" --vfs-cache-mode writes \
		--cache-dir "$WORK/rclone-cache" --rc --rc-addr "127.0.0.1:$RC_PORT" --rc-no-auth \
		>>"$log" 2>&1 &
	MOUNTS[$MNT]=$!
	if ! wait_mounted "$MNT" "${MOUNTS[$MNT]}"; then
		fail rmount-cp "$w" "rclone mount failed ($(lastlog "$log"))"
		unmount "$MNT"
		smb_rm "$d"
		return 0
	fi
	c0=$(cpu_jiffies)
	t0=$(now)
	if ! cp -r "$SHM/$w/." "$MNT/" >>"$log" 2>&1; then
		fail rmount-cp "$w" "cp failed ($(lastlog "$log"))"
	else
		t1=$(now)
		c1=$(cpu_since "$c0")
		res rmount-cp "$w" "$(secs "$t0" "$t1")" "$c1"
		n=$(rmount_wait) || n=x
		t1=$(now)
		c1=$(cpu_since "$c0")
		if [[ $n != 0 ]]; then
			fail rmount-nas "$w" "uploads still pending ($n) after 10 min"
		elif check rmount-nas "$w" "$NAS_SHARE_DIR/$BENCH_ID/$d"; then
			res rmount-nas "$w" "$(secs "$t0" "$t1")" "$c1"
		fi
	fi
	unmount "$MNT"
	rm -rf "$WORK/rclone-cache"
	smb_rm "$d"
}

# --- ferryfs ----------------------------------------------------------------------------------
row fnfs-local push "cp -r to local disk (/var/tmp): what ferryfs's cp compares with"
row fnfs-cp push "ferryfs nfs://: cp -r (returns)"
row fnfs-flush push "ferryfs nfs://: until flush --wait returns (from the start of cp)"
row fnfs-read pull "ferryfs nfs://: cold read, cp -r from a fresh mount"
row fnpt-cp push "ferryfs nfs:// -o passthrough: cp -r (returns)"
row fnpt-flush push "ferryfs nfs:// -o passthrough: until flush --wait returns (from the start of cp)"
row fnpt-read pull "ferryfs nfs:// -o passthrough: cold read, cp -r from a fresh mount"
row fsmb-cp push "ferryfs smb://: cp -r (returns)"
row fsmb-flush push "ferryfs smb://: until flush --wait returns (from the start of cp)"
row fsmb-read pull "ferryfs smb://: cold read, cp -r from a fresh mount"
row fspt-cp push "ferryfs smb:// -o passthrough: cp -r (returns)"
row fspt-flush push "ferryfs smb:// -o passthrough: until flush --wait returns (from the start of cp)"
row fspt-read pull "ferryfs smb:// -o passthrough: cold read, cp -r from a fresh mount"
row fsdr-flush push "ferryfs smb://: the flush alone: cp -r with the flush paused, then from ferryfs resume until flush --wait returns"
row fndr-flush push "ferryfs nfs://: the flush alone (the same)"
row fagt-cp push "ferryfs nfs:// + ferry-agent: cp -r (returns)"
row fagt-flush push "ferryfs nfs:// + ferry-agent: until flush --wait returns (from the start of cp)"
row fsag-cp push "ferryfs smb:// + ferry-agent: cp -r (returns)"
row fsag-flush push "ferryfs smb:// + ferry-agent: until flush --wait returns (from the start of cp)"
AGENT_PORT=7077     # over the export (nfs://)
AGENT_SMB_PORT=7078 # over the share (smb://)
# agent_up NAME DIR PORT: ferry-agent in the NAS namespace, serving DIR
agent_up() {
	local i
	[[ -x $AGENT ]] || die "no $AGENT (build the ferry-agent target)"
	[[ -f $WORK/agent.key ]] || head -c 32 /dev/urandom | base64 >"$WORK/agent.key"
	chmod 600 "$WORK/agent.key"
	nsenter --net="$NAS_NETNS" -- "$AGENT" --root "$2" \
		--listen "$NAS_IP:$3" --key-file "$WORK/agent.key" >"$LOGS/$1.log" 2>&1 &
	PIDS[$1]=$!
	for ((i = 0; i < 50; i++)); do
		grep -q serving "$LOGS/$1.log" && return 0
		kill -0 "${PIDS[$1]}" 2>/dev/null || break
		sleep 0.1
	done
	die "ferry-agent did not start: $(lastlog "$LOGS/$1.log")"
}
FSMB_NA=
ferry_mount() { # PREFIX URL [EXTRA_OPTS]: a fresh journal and cache
	rm -rf "$WORK/journal" "$WORK/cache"
	"${CLI[@]}" "$FERRYFS" mount "$2" "$MNT" -f \
		-o "journal=$WORK/journal,cache=$WORK/cache,streams=$STREAMS${3:+,$3}" >>"$LOGS/$1.log" 2>&1 &
	MOUNTS[$MNT]=$!
	wait_mounted "$MNT" "${MOUNTS[$MNT]}"
}
# g_ferry PREFIX URL NASDIR MKDIR RM EXTRA W
g_ferry() {
	local p=$1 url=$2 nasdir=$3 mk=$4 rmf=$5 extra=$6 w=$7 d t0 t1 c0 dst log=$LOGS/$1.log
	d=$p-r$RUN-$w
	if [[ -n $FSMB_NA && $p == fsmb ]]; then
		na fsmb-cp "$w" "$FSMB_NA" && na fsmb-flush "$w" "$FSMB_NA" && na fsmb-read "$w" "$FSMB_NA"
		return 0
	fi
	if [[ -z ${LOCAL_DONE["$RUN|$w"]:-} ]]; then # the local-disk baseline of cp, once per run
		LOCAL_DONE["$RUN|$w"]=1
		dst=$(local_dir)
		drop_caches
		if timed "$log" cp -r "$SHM/$w/." "$dst/"; then
			res fnfs-local "$w" "$T" "$C"
		else
			fail fnfs-local "$w" "cp failed ($(lastlog "$log"))"
		fi
		rm -rf "$dst"
	fi
	"$mk" "$d"
	drop_caches
	if ! ferry_mount "$p" "$url/$BENCH_ID/$d" "$extra"; then
		unmount "$MNT"
		if [[ $p == fsmb ]] && grep -q 'Protocol not supported' "$log"; then
			FSMB_NA="n/a (smb driver not built)"
			na fsmb-cp "$w" "$FSMB_NA" && na fsmb-flush "$w" "$FSMB_NA" && na fsmb-read "$w" "$FSMB_NA"
		else
			fail "$p-cp" "$w" "mount failed ($(lastlog "$log"))"
		fi
		"$rmf" "$d"
		return 0
	fi
	if [[ $p == fsdr || $p == fndr ]]; then # the flush alone: from a full journal
		if ! "$FERRYFS" pause "$MNT" >>"$log" 2>&1 || ! cp -r "$SHM/$w/." "$MNT/" >>"$log" 2>&1; then
			fail "$p-flush" "$w" "pause or cp failed ($(lastlog "$log"))"
			unmount "$MNT"
			"$rmf" "$d"
			return 0
		fi
		c0=$(cpu_jiffies)
		t0=$(now)
		"$FERRYFS" resume "$MNT" >>"$log" 2>&1 || fail "$p-flush" "$w" "resume failed ($(lastlog "$log"))"
	else
		c0=$(cpu_jiffies)
		t0=$(now)
		if ! cp -r "$SHM/$w/." "$MNT/" >>"$log" 2>&1; then
			fail "$p-cp" "$w" "cp failed ($(lastlog "$log"))"
			unmount "$MNT"
			"$rmf" "$d"
			return 0
		fi
		t1=$(now)
		res "$p-cp" "$w" "$(secs "$t0" "$t1")" "$(cpu_since "$c0")"
	fi
	if "$FERRYFS" flush "$MNT" --wait >>"$log" 2>&1; then
		t1=$(now)
		C=$(cpu_since "$c0")
		check "$p-flush" "$w" "$nasdir/$BENCH_ID/$d" && res "$p-flush" "$w" "$(secs "$t0" "$t1")" "$C"
	else
		fail "$p-flush" "$w" "flush --wait failed ($(lastlog "$log"))"
	fi
	if [[ $p == fagt || $p == fsag ]]; then # through the agent, unless it fell back:
		if "$FERRYFS" status "$MNT" --json 2>/dev/null | grep -q '"via": "share"'; then
			fail "$p-flush" "$w" "a stream flushed through the share, not the agent"
		fi
	fi
	unmount "$MNT"
	if [[ $p == fagt || $p == fsag || $p == fsdr || $p == fndr || -n $NO_READ ]]; then # reads do not involve the agent: see fnfs-read
		"$rmf" "$d"
		rm -rf "$WORK/journal" "$WORK/cache"
		return 0
	fi
	dst=$(local_dir)
	drop_caches
	if ferry_mount "$p" "$url/$BENCH_ID/$d" "$extra" && timed "$log" cp -r "$MNT/." "$dst/"; then
		check "$p-read" "$w" "$dst" && res "$p-read" "$w" "$T" "$C"
	else
		fail "$p-read" "$w" "mount or cp failed ($(lastlog "$log"))"
	fi
	unmount "$MNT"
	rm -rf "$WORK/journal" "$WORK/cache" "$dst"
	"$rmf" "$d"
}

# --- run ---------------------------------------------------------------------------------------------
want sshfs && sshd_up
want ferryfs-agent && agent_up agent "$NAS_EXPORT_DIR" "$AGENT_PORT"
want ferryfs-smb-agent && agent_up agent-smb "$NAS_SHARE_DIR" "$AGENT_SMB_PORT"
{ want rclone-copy || want rclone-mount; } && rclone_env
say "NAS: rate $NAS_RATE, flow cap $NAS_FLOW_CAP, clients to $HOST$([[ -n $OPT_DELAY ]] && echo " (delay line, $NAS_DELAY_MS ms one way)"); $RUNS run(s)"
T_START=$(now)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for ((RUN = 1; RUN <= RUNS; RUN++)); do
	say "run $RUN/$RUNS: iperf3"
	g_iperf || true
	# every other run in the reverse order: no row always runs right
	# after the same one (and its clean-up: a 1 GiB delete on the NAS)
	order=(nfs-cp smbclient sshfs rclone-copy rclone-mount ferryfs-nfs ferryfs-nfs-pt ferryfs-nfs-drain ferryfs-smb ferryfs-smb-pt ferryfs-smb-drain ferryfs-agent ferryfs-smb-agent)
	((RUN % 2)) || order=(ferryfs-smb-agent ferryfs-agent ferryfs-smb-drain ferryfs-smb-pt ferryfs-smb ferryfs-nfs-drain ferryfs-nfs-pt ferryfs-nfs rclone-mount rclone-copy sshfs smbclient nfs-cp)
	for w in "${WLS[@]}"; do
		for g in "${order[@]}"; do
			want "$g" || continue
			say "run $RUN/$RUNS: $g ${WL_LABEL[$w]}"
			case $g in
			nfs-cp) g_nfscp "$w" || true ;;
			smbclient) g_smbclient "$w" || true ;;
			sshfs) g_sshfs "$w" || true ;;
			rclone-copy) g_rclone_copy "$w" || true ;;
			rclone-mount) g_rclone_mount "$w" || true ;;
			ferryfs-nfs) g_ferry fnfs "$NFS_BASE" "$NAS_EXPORT_DIR" nfs_mkdir nfs_rm "" "$w" || true ;;
			ferryfs-nfs-pt) g_ferry fnpt "$NFS_BASE" "$NAS_EXPORT_DIR" nfs_mkdir nfs_rm passthrough "$w" || true ;;
			ferryfs-agent)
				g_ferry fagt "$NFS_BASE" "$NAS_EXPORT_DIR" nfs_mkdir nfs_rm \
					"agent=$HOST:$AGENT_PORT/$BENCH_ID/fagt-r$RUN-$w,agent_key=$WORK/agent.key" "$w" || true
				;;
			ferryfs-smb)
				g_ferry fsmb "smb://$SMB_USER@$HOST/nas" "$NAS_SHARE_DIR" smb_mkdir smb_rm \
					"credentials=$SMB_CRED_FILE" "$w" || true
				;;
			ferryfs-smb-drain)
				g_ferry fsdr "smb://$SMB_USER@$HOST/nas" "$NAS_SHARE_DIR" smb_mkdir smb_rm \
					"credentials=$SMB_CRED_FILE" "$w" || true
				;;
			ferryfs-nfs-drain) g_ferry fndr "$NFS_BASE" "$NAS_EXPORT_DIR" nfs_mkdir nfs_rm "" "$w" || true ;;
			ferryfs-smb-pt)
				g_ferry fspt "smb://$SMB_USER@$HOST/nas" "$NAS_SHARE_DIR" smb_mkdir smb_rm \
					"credentials=$SMB_CRED_FILE,passthrough" "$w" || true
				;;
			ferryfs-smb-agent)
				g_ferry fsag "smb://$SMB_USER@$HOST/nas" "$NAS_SHARE_DIR" smb_mkdir smb_rm \
					"credentials=$SMB_CRED_FILE,agent=$HOST:$AGENT_SMB_PORT/$BENCH_ID/fsag-r$RUN-$w,agent_key=$WORK/agent.key" "$w" || true
				;;
			esac
		done
	done
done
T_TOTAL=$(secs "$T_START" "$(now)")
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# --- table -----------------------------------------------------------------------------------------
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[++n] = $1 } END { if (!n) exit 1; print (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }'; }
LINK_PUSH=$(median <<<"${IPERF[iperf-p4]:-}") || LINK_PUSH=
LINK_PULL=$(median <<<"${IPERF[iperf-p4r]:-}") || LINK_PULL=

row_group() {
	case $1 in
	iperf*) echo iperf ;; nfscp*) echo nfs-cp ;; smb-*) echo smbclient ;; sshfs*) echo sshfs ;;
	rclone*) echo rclone-copy ;; rmount*) echo rclone-mount ;; fnfs-local) echo local ;; fnfs*) echo ferryfs-nfs ;; fnpt*) echo ferryfs-nfs-pt ;; fspt*) echo ferryfs-smb-pt ;;
	fsmb*) echo ferryfs-smb ;; fsdr*) echo ferryfs-smb-drain ;; fndr*) echo ferryfs-nfs-drain ;;
	fagt*) echo ferryfs-agent ;; fsag*) echo ferryfs-smb-agent ;;
	esac
}

cell() { # ROW WL
	local id=$1 w=$2 k="$1|$2" link med g cpu
	link=$LINK_PUSH
	[[ ${ROW_DIR[$id]} == pull ]] && link=$LINK_PULL
	if [[ $id == iperf-* ]]; then
		g=$(median <<<"${IPERF[$id]:-}") || {
			echo "FAIL"
			return
		}
		awk -v g="$g" -v b="${WL_BYTES[$w]}" -v l="$link" 'BEGIN {
			printf "%.2f s · %.3f Gbit/s · %.2f", b * 8 / (g * 1e9), g, g / l }'
		return
	fi
	if [[ -n ${NA_CELLS[$k]:-} ]]; then
		echo "${NA_CELLS[$k]}"
	elif [[ -n ${FAILS[$k]:-} ]]; then
		echo "FAIL (see below)"
	elif med=$(median <<<"${VALS[$k]:-}"); then
		cpu=$(median <<<"${CPUS[$k]:-}") || cpu=
		awk -v t="$med" -v b="${WL_BYTES[$w]}" -v l="$link" -v c="$cpu" 'BEGIN {
			lt = (l > 0) ? b * 8 / (l * 1e9) : 0
			printf "%.2f s · %.0f MB/s · %.2f", t, b / t / 1e6, (l > 0 && t > 0) ? lt / t : 0
			if (c != "") printf " · %.2f cpu-s", c }'
	else
		echo "-"
	fi
}

machine() {
	local cpu mem
	cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
	mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
	echo "$cpu, $(nproc) cores, $mem RAM; kernel $(uname -r); Debian $(cat /etc/debian_version 2>/dev/null)"
}

report() {
	local id w line rev
	rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")
	git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || rev+=" + local changes"
	echo
	echo "## run.sh: ferryfs against today's tools over the bench NAS — $(date -u '+%Y-%m-%d %H:%M') UTC"
	echo
	echo "- command: \`$CMDLINE\`"
	echo "- NAS (nas.sh): rate $NAS_RATE, flow cap $NAS_FLOW_CAP, clients to $HOST$([[ -n $OPT_DELAY ]] && echo " through the delay line ($NAS_DELAY_MS ms one way)" || echo " (no delay line)")"
	echo "- ferryfs: $("$FERRYFS" --version 2>&1 | head -1) (git $rev), streams=$STREAMS, write-back, journal on $(df -P "$WORK" | awk 'NR == 2 { print $1 }') under $BENCH_PARENT"
	echo "- clients: libnfs-utils $(dpkg-query -W -f='${Version}' libnfs-utils), smbclient $(dpkg-query -W -f='${Version}' smbclient), sshfs $(dpkg-query -W -f='${Version}' sshfs), rclone $(dpkg-query -W -f='${Version}' rclone), iperf3 $(dpkg-query -W -f='${Version}' iperf3)"
	echo "- machine: $(machine); NAS directories on $(df -P "$NAS_EXPORT_DIR" | awk 'NR == 2 { print $1 }')"
	line="- workloads:"
	for w in "${WLS[@]}"; do
		line+=" ${WL_LABEL[$w]}"
		[[ $w != tree ]] || line+=" of 1-16 KiB in 100 dirs"
		line+=" (${WL_BYTES[$w]} B),"
	done
	echo "${line%,}; sources on tmpfs, random bytes"
	echo "- method: $RUNS run(s), median; sync + drop_caches before every measurement, then $PREFAULT_MB MiB prefaulted; the VM's free page reporting $(if [[ -n $PR_OLD ]]; then echo "held off (order $PR_OLD -> $PR_SET)"; elif [[ -e $PR_PARAM ]]; then echo "left on"; else echo "absent"; fi); every write checked by SHA-256 on the NAS side, every read locally; whole run ${T_TOTAL} s; load average at start $LOAD_START, at end $LOAD_END (other work on the machine shows up in the figures)"
	echo "- cell: median time · MB/s (10^6 B/s) · ratio = (bytes / iperf3 -P4 rate of that direction) / time (1.00 = the link's speed) · median CPU-seconds the whole machine was busy meanwhile (client, ferryfs, the NAS's servers: $(nproc) CPUs, shared)"
	echo
	line="| row |"
	for w in "${WLS[@]}"; do line+=" ${WL_LABEL[$w]} |"; done
	echo "$line"
	line="|---|"
	for w in "${WLS[@]}"; do line+="---|"; done
	echo "$line"
	for id in "${ROW_ORDER[@]}"; do
		want "$(row_group "$id")" || continue
		line="| ${ROW_LABEL[$id]} |"
		for w in "${WLS[@]}"; do line+=" $(cell "$id" "$w") |"; done
		echo "$line"
	done
	echo
	echo "Raw seconds per run (iperf3: Gbit/s; busy CPU-seconds in parentheses):"
	echo
	for id in iperf-p1 iperf-p4 iperf-p1r iperf-p4r; do
		echo "- $id: $(for v in ${IPERF[$id]:-}; do printf '%.3f\n' "$v"; done | paste -sd' ')"
	done
	for id in "${ROW_ORDER[@]}"; do
		[[ $id == iperf-* ]] && continue
		want "$(row_group "$id")" || continue
		line="- $id:"
		for w in "${WLS[@]}"; do
			[[ -n ${NA_CELLS["$id|$w"]:-} ]] && continue
			line+=" $w: $(echo ${VALS["$id|$w"]:-none})"
			[[ -z ${CPUS["$id|$w"]:-} ]] || line+=" (cpu-s: $(echo ${CPUS["$id|$w"]}))"
			line+=";"
		done
		[[ $line == "- $id:" ]] || echo "${line%;}"
	done
	local any=0 k
	for k in "${!FAILS[@]}"; do
		((any)) || {
			echo
			echo "Failures:"
			echo
		}
		any=1
		echo "- $k: ${FAILS[$k]}"
	done
}

report >"$WORK/report.md"
cat "$WORK/report.md"
if ((APPEND)); then
	cat "$WORK/report.md" >>"$RESULTS"
	say "appended to $RESULTS"
fi
