#!/bin/bash
# nas.sh — a real NAS on the bench (issue 4): nfs-ganesha (NFSv3 + NFSv4,
# FSAL VFS), samba and iperf3 in a network namespace, reached from a client
# namespace over a shaped veth link, plus a userspace delay line that adds
# round-trip time. See tests/bench/README-nas.md.
#
#   tests/bench/nas.sh up     [--rate 1gbit|10gbit|RATE|none] [--flow-cap RATE|none]
#                             [--delay-ms MS] [--export DIR] [--share DIR]
#   tests/bench/nas.sh env    # shell variables for tests: eval "$(nas.sh env)"
#   tests/bench/nas.sh status # what runs, and end-to-end checks from the client
#   tests/bench/nas.sh restart-nfs # stop ganesha and start it again (it_nfs)
#   tests/bench/nas.sh down   [--purge]
#
# up      Installs the Debian packages it needs (quick when present), creates
#         the namespaces ferry-nas (10.77.0.1) and ferry-client (10.77.0.2)
#         joined by a veth pair, shapes both directions with tc tbf at --rate
#         (default 1gbit; none: no qdisc) and, with --flow-cap, caps each TCP
#         flow with htb leaf classes chosen by a u32 hash of the client's port
#         (the client's ephemeral ports are pinned to 256 ports for that).
#         Starts rpcbind, ganesha, smbd and iperf3 in ferry-nas and the delay
#         line (--delay-ms one way, default 0.5) in ferry-client, which makes
#         10.77.0.3 a delayed copy of the NAS (ports 111 2049 20048 445 5201,
#         and 7077, 7078 for the ferry-agents run.sh starts in ferry-nas).
#         Run again to change a setting: options not given keep their last
#         value; what runs with the same configuration is left alone, what is
#         missing or configured differently is (re)started.
# restart-nfs  A server restart under its clients: TERM to ganesha, then
#         started again with the same configuration; returns once it answers.
# down    Stops everything up started (by PID), deletes both namespaces (and so
#         the veth pair) and the run directory. Keeps the export and share
#         directories unless --purge (which also removes the 'ferry' user if
#         up created it). Safe to run twice.
# Needs root (env does not). Every address used is inside the two namespaces.
set -euo pipefail
shopt -s inherit_errexit

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROG=nas.sh

NS_NAS=ferry-nas
NS_CLI=ferry-client
NETNS_NAS=/run/netns/$NS_NAS
NETNS_CLI=/run/netns/$NS_CLI
VETH_NAS=fnas0
VETH_CLI=fcli0
NAS_IP=10.77.0.1
CLI_IP=10.77.0.2
DELAY_IP=10.77.0.3
MNT_PORT=20048
DELAY_PORTS=(111 2049 "$MNT_PORT" 445 5201 7077 7078) # 7077, 7078: ferry-agents (run.sh)
# 256 ports starting at a multiple of 256: the low byte of the port, which the
# per-flow hash uses, is then different for every ephemeral port.
PORT_RANGE_CAPPED="40960 41215"
PORT_RANGE_DEFAULT="32768 60999"
BASE=/var/tmp/ferry-nas
RUN=$BASE/run
PIDS=$RUN/pids
LOGS=$RUN/log
SMB_USER=ferry
SMB_SHARE=nas
NFS_PSEUDO=/export
USER_MARK=$BASE/.ferry-user-created

PACKAGES=(nfs-ganesha nfs-ganesha-vfs rpcbind samba smbclient iperf3 libnfs-utils iproute2)

say() { echo "$PROG: $*" >&2; }
die() {
	say "error: $*"
	exit 1
}

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	exit "${1:-0}"
}

# --- settings: defaults < last up (state file) < command line ---------------
RATE=1gbit
FLOW_CAP=none
DELAY_MS=0.5
EXPORT_DIR=$BASE/export
SHARE_DIR=$BASE/share

load_state() {
	if [[ -f $RUN/state ]]; then
		# shellcheck source=/dev/null
		. "$RUN/state"
	fi
}

save_state() {
	{
		printf 'RATE=%q\n' "$RATE"
		printf 'FLOW_CAP=%q\n' "$FLOW_CAP"
		printf 'DELAY_MS=%q\n' "$DELAY_MS"
		printf 'EXPORT_DIR=%q\n' "$EXPORT_DIR"
		printf 'SHARE_DIR=%q\n' "$SHARE_DIR"
	} >"$RUN/state.new"
	mv "$RUN/state.new" "$RUN/state"
}

valid_rate() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]]; }

# bits per second of a tc rate such as 250mbit
rate_bps() {
	awk -v r="$1" 'BEGIN {
		n = r + 0; u = r; sub(/^[0-9.]+/, "", u)
		m = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : 1
		printf "%.0f\n", n * m }'
}

# --- processes ---------------------------------------------------------------
ns_inode() { stat -L -c %i "$1" 2>/dev/null || true; }

# pid_alive NAME COMM NETNS_FILE: the PID in $PIDS/NAME.pid runs COMM in NETNS
pid_alive() {
	local f=$PIDS/$1.pid pid comm want
	[[ -s $f ]] || return 1
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
	[[ $comm == "$2" ]] || return 1
	want=$(ns_inode "$3")
	[[ -n $want && $(ns_inode "/proc/$pid/ns/net") == "$want" ]]
}

# start_bg NAME CMD...: run CMD in the background, logging to $LOGS/NAME.log;
# its PID goes to $PIDS/NAME.pid. CMD is nsenter ... -- setsid PROG ...: both
# exec without forking, so $! is the daemon itself.
start_bg() {
	local name=$1
	shift
	"$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
	echo $! >"$PIDS/$name.pid"
}

# running PID: exists and is not a zombie (daemons whose parent exited are
# reaped by init, which may take its time)
running() {
	local st
	st=$(sed 's/.*) //; s/ .*//' "/proc/$1/stat" 2>/dev/null) || return 1
	[[ -n $st && $st != Z && $st != X ]]
}

# stop_pid NAME COMM NETNS: TERM, then KILL after 5 s
stop_pid() {
	local name=$1 pid i
	if pid_alive "$@"; then
		pid=$(<"$PIDS/$name.pid")
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < 100; i++)); do
			running "$pid" || break
			sleep 0.05
		done
		if running "$pid"; then
			say "$name ($pid) ignored TERM; killing"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$PIDS/$name.pid"
}

# kill whatever still runs in a namespace (only nas.sh's daemons and their
# children run in ferry-nas; clients may have been left in ferry-client)
sweep_netns() {
	local ns=$1 pids pid i
	pids=$(ip netns pids "$ns" 2>/dev/null || true)
	[[ -n $pids ]] || return 0
	for pid in $pids; do
		running "$pid" || continue
		say "stopping leftover process in $ns: $pid $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
		kill -TERM "$pid" 2>/dev/null || true
	done
	for ((i = 0; i < 30; i++)); do
		live_in_netns "$ns" || return 0
		sleep 0.1
	done
	for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
		kill -KILL "$pid" 2>/dev/null || true
	done
	sleep 0.2
}

live_in_netns() {
	local pid
	for pid in $(ip netns pids "$1" 2>/dev/null || true); do
		running "$pid" && return 0
	done
	return 1
}

# wait_until DESC SECONDS CMD...
wait_until() {
	local desc=$1 secs=$2 i
	shift 2
	for ((i = 0; i < secs * 10; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.1
	done
	die "timed out after ${secs}s waiting for $desc (logs: $LOGS)"
}

in_nas_net() { nsenter --net="$NETNS_NAS" -- "$@"; }
in_cli_net() { nsenter --net="$NETNS_CLI" -- "$@"; }
# The daemons' own namespace: ferry-nas's network + a private mount namespace
# with an empty /run (so rpcbind's socket and state never meet a host
# rpcbind). IN_NAS is the command prefix, for start_bg, which needs an exec.
IN_NAS=()
set_in_nas() { IN_NAS=(nsenter --target "$(<"$PIDS/holder.pid")" --mount --net --); }
in_nas() { "${IN_NAS[@]}" "$@"; }

not() { ! "$@"; }

listening() { # NETNS_FILE PORT: something listens on TCP PORT there
	[[ -n $(nsenter --net="$1" -- ss -Hltn "sport = :$2" 2>/dev/null) ]]
}

# --- packages -----------------------------------------------------------------
install_packages() {
	local missing=() p status
	local need=("${PACKAGES[@]}")
	command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
	for p in "${need[@]}"; do
		status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
		[[ $status == installed ]] || missing+=("$p")
	done
	say "packages (add to scripts/deps.sh): ${PACKAGES[*]}"
	((${#missing[@]})) || return 0
	say "installing: ${missing[*]}"
	local opts=(-q -y --no-install-recommends -o Dpkg::Options::=--force-confdef
		-o Dpkg::Options::=--force-confold -o Dpkg::Use-Pty=0)
	if ! DEBIAN_FRONTEND=noninteractive apt-get install "${opts[@]}" "${missing[@]}" </dev/null; then
		DEBIAN_FRONTEND=noninteractive apt-get -q update
		DEBIAN_FRONTEND=noninteractive apt-get install "${opts[@]}" "${missing[@]}" </dev/null
	fi
}

# --- network --------------------------------------------------------------------
net_up() {
	local ns
	for ns in "$NS_NAS" "$NS_CLI"; do
		[[ -e /run/netns/$ns ]] || ip netns add "$ns"
		ip -n "$ns" link set lo up
		in_net_sysctl "$ns" net.ipv6.conf.all.disable_ipv6=1
		in_net_sysctl "$ns" net.ipv6.conf.default.disable_ipv6=1
	done
	if ! ip -n "$NS_NAS" link show "$VETH_NAS" >/dev/null 2>&1; then
		ip -n "$NS_CLI" link del "$VETH_CLI" 2>/dev/null || true
		ip link add "$VETH_NAS" netns "$NS_NAS" type veth peer name "$VETH_CLI" netns "$NS_CLI"
	fi
	ip -n "$NS_NAS" addr replace "$NAS_IP/24" dev "$VETH_NAS"
	ip -n "$NS_CLI" addr replace "$CLI_IP/24" dev "$VETH_CLI"
	ip -n "$NS_CLI" addr replace "$DELAY_IP/32" dev lo
	ip -n "$NS_NAS" link set "$VETH_NAS" up
	ip -n "$NS_CLI" link set "$VETH_CLI" up
	in_net_sysctl "$NS_CLI" net.ipv4.tcp_tw_reuse=1
	if [[ $FLOW_CAP == none ]]; then
		in_net_sysctl "$NS_CLI" "net.ipv4.ip_local_port_range=$PORT_RANGE_DEFAULT"
	else
		in_net_sysctl "$NS_CLI" "net.ipv4.ip_local_port_range=$PORT_RANGE_CAPPED"
	fi
}

in_net_sysctl() { nsenter --net="/run/netns/$1" -- sysctl -q -w "$2" >/dev/null; }

# shape NS DEV KEY: KEY is "sport" on the client's side (client -> nas
# packets carry the client port as source) and "dport" on the nas side.
shape() {
	local ns=$1 dev=$2 key=$3 bps burst cap_bps cap_burst mask hparent i x
	tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
	hparent=root
	if [[ $RATE != none ]]; then
		bps=$(rate_bps "$RATE")
		# 1 ms of the rate, at least 64 KiB (a GSO packet)
		burst=$((bps / 8000 > 65536 ? bps / 8000 : 65536))
		tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$RATE" burst "$burst" latency 10ms
		hparent="parent 1:1"
	fi
	[[ $FLOW_CAP != none ]] || return 0
	cap_bps=$(rate_bps "$FLOW_CAP")
	cap_burst=$((cap_bps / 8000 > 65536 ? cap_bps / 8000 : 65536))
	# TCP ports are the first 32-bit word after a 20-byte IP header:
	# sport << 16 | dport; the hash takes the low byte of the client's port.
	if [[ $key == sport ]]; then mask=0x00ff0000; else mask=0x000000ff; fi
	{
		echo "qdisc add dev $dev $hparent handle 10: htb default 2"
		echo "class add dev $dev parent 10: classid 10:2 htb rate 100gbit quantum 60000"
		for ((i = 0; i < 256; i++)); do
			x=$(printf %x $((0x100 + i)))
			echo "class add dev $dev parent 10: classid 10:$x htb rate $FLOW_CAP ceil $FLOW_CAP burst $cap_burst cburst $cap_burst quantum 60000"
			echo "qdisc add dev $dev parent 10:$x handle $x: bfifo limit $((cap_burst * 16))"
		done
		echo "filter add dev $dev parent 10: prio 1 handle 2: protocol ip u32 divisor 256"
		echo "filter add dev $dev parent 10: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask $mask at 20 link 2:"
		for ((i = 0; i < 256; i++)); do
			echo "filter add dev $dev parent 10: prio 1 protocol ip u32 ht 2:$(printf %x "$i"): match u32 0 0 flowid 10:$(printf %x $((0x100 + i)))"
		done
	} >"$RUN/tc-$dev.batch"
	tc -n "$ns" -batch "$RUN/tc-$dev.batch"
}

# --- daemons ----------------------------------------------------------------------
holder_up() {
	if pid_alive holder sleep "$NETNS_NAS"; then
		set_in_nas
		return 0
	fi
	# No holder: whatever runs in ferry-nas is a leftover of an earlier run.
	sweep_netns "$NS_NAS"
	rm -f "$PIDS"/*.pid
	start_bg holder nsenter --net="$NETNS_NAS" -- unshare --mount --propagation private -- setsid sleep infinity
	wait_until "the namespace holder" 5 pid_alive holder sleep "$NETNS_NAS"
	wait_until "its mount namespace" 5 test "$(stat -L -c %i "/proc/$(<"$PIDS/holder.pid")/ns/mnt")" != "$(stat -L -c %i /proc/self/ns/mnt)"
	set_in_nas
	# The new mount namespace got a private copy of every mount of the
	# host, FUSE mounts included; a copy keeps its FUSE connection alive
	# after the host unmounts it, so that daemon would never see the
	# unmount and never exit. Drop the copies: the NAS needs none of them.
	in_nas findmnt -rn -o TARGET,FSTYPE 2>/dev/null |
		while read -r m t; do
			[[ "$t" == fuse* ]] || continue
			in_nas umount -l "$(printf '%b' "$m")" 2>/dev/null || true
		done
	in_nas mount -t tmpfs -o mode=0755,size=64m ferry-nas-run /run
}

rpcbind_up() {
	pid_alive rpcbind rpcbind "$NETNS_NAS" && return 0
	start_bg rpcbind "${IN_NAS[@]}" setsid rpcbind -f
	wait_until "rpcbind" 10 listening "$NETNS_NAS" 111
}

ganesha_conf() {
	cat <<EOF
# written by tests/bench/nas.sh
NFS_CORE_PARAM {
	Protocols = 3, 4;
	NFS_Port = 2049;
	MNT_Port = $MNT_PORT;
	Enable_NLM = false;
	Enable_RQUOTA = false;
	Enable_UDP = false;
	# NFSv3 mounts the pseudo path too: nfs://HOST$NFS_PSEUDO for both versions
	mount_path_pseudo = true;
	Clustered = false;
}
NFSV4 {
	# no 90 s grace period after a start (nothing to reclaim on a bench)
	Graceless = true;
	RecoveryBackend = fs;
	RecoveryRoot = "$RUN/ganesha/recovery";
	Only_Numeric_Owners = true;
}
EXPORT {
	Export_Id = 77;
	Path = "$EXPORT_DIR";
	Pseudo = "$NFS_PSEUDO";
	Protocols = 3, 4;
	Transports = TCP;
	Access_Type = RW;
	Squash = No_Root_Squash;
	SecType = sys;
	FSAL {
		Name = VFS;
	}
}
NFS_KRB5 {
	Active_krb5 = false;
}
LOG {
	Default_Log_Level = EVENT;
}
EOF
}

ganesha_up() {
	mkdir -p "$RUN/ganesha/recovery"
	ganesha_conf >"$RUN/ganesha/ganesha.conf.new"
	if pid_alive ganesha ganesha.nfsd "$NETNS_NAS" &&
		cmp -s "$RUN/ganesha/ganesha.conf.new" "$RUN/ganesha/ganesha.conf"; then
		rm -f "$RUN/ganesha/ganesha.conf.new"
		return 0
	fi
	stop_pid ganesha ganesha.nfsd "$NETNS_NAS"
	mv "$RUN/ganesha/ganesha.conf.new" "$RUN/ganesha/ganesha.conf"
	start_bg ganesha "${IN_NAS[@]}" setsid ganesha.nfsd -F -f "$RUN/ganesha/ganesha.conf" \
		-L "$LOGS/ganesha.log" -p "$RUN/ganesha/ganesha.pid" -N NIV_EVENT
	wait_until "ganesha on port 2049" 30 listening "$NETNS_NAS" 2049
	wait_until "ganesha's MOUNT on port $MNT_PORT" 10 listening "$NETNS_NAS" "$MNT_PORT"
	wait_until "ganesha registered with rpcbind" 10 rpc_registered
}

rpc_registered() {
	local out
	out=$(in_nas_net rpcinfo -p 127.0.0.1) || return 1
	grep -q ' 100003 ' <<<"$out" && grep -q ' 100005 ' <<<"$out"
}

smb_conf() {
	local s=$RUN/samba
	cat <<EOF
# written by tests/bench/nas.sh
[global]
	server role = standalone server
	workgroup = WORKGROUP
	netbios name = FERRYNAS
	server min protocol = SMB2
	smb ports = 445
	disable netbios = yes
	passdb backend = tdbsam
	private dir = $s/private
	lock directory = $s/lock
	state directory = $s/state
	cache directory = $s/cache
	pid directory = $s/run
	ncalrpc dir = $s/ncalrpc
	log file = $LOGS/smbd.log
	max log size = 10000
	log level = 1
	map to guest = never
	load printers = no
	printing = bsd
	printcap name = /dev/null
	disable spoolss = yes
	usershare max shares = 0

[$SMB_SHARE]
	path = $SHARE_DIR
	read only = no
	valid users = $SMB_USER
EOF
}

samba_up() {
	local s=$RUN/samba pw
	mkdir -p "$s/private" "$s/lock" "$s/state" "$s/cache" "$s/run" "$s/ncalrpc"
	chmod 0700 "$s/private"
	if ! id "$SMB_USER" >/dev/null 2>&1; then
		useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$SMB_USER"
		touch "$USER_MARK"
	fi
	smb_conf >"$s/smb.conf.new"
	if [[ ! -s $RUN/smb.cred ]]; then
		pw=$(head -c 18 /dev/urandom | base64 | tr -d '+/=')
		printf '%s\n%s\n' "$pw" "$pw" |
			smbpasswd -c "$s/smb.conf.new" -s -a "$SMB_USER" >"$LOGS/smbpasswd.log" 2>&1 ||
			die "smbpasswd failed: $(cat "$LOGS/smbpasswd.log")"
		(
			umask 077
			printf 'username=%s\npassword=%s\ndomain=WORKGROUP\n' "$SMB_USER" "$pw" >"$RUN/smb.cred.new"
		)
		mv "$RUN/smb.cred.new" "$RUN/smb.cred"
	fi
	if pid_alive smbd smbd "$NETNS_NAS" && cmp -s "$s/smb.conf.new" "$s/smb.conf"; then
		rm -f "$s/smb.conf.new"
		return 0
	fi
	stop_pid smbd smbd "$NETNS_NAS"
	mv "$s/smb.conf.new" "$s/smb.conf"
	start_bg smbd "${IN_NAS[@]}" setsid smbd --foreground --no-process-group --configfile="$s/smb.conf"
	wait_until "smbd on port 445" 20 listening "$NETNS_NAS" 445
}

iperf_up() {
	pid_alive iperf3 iperf3 "$NETNS_NAS" && return 0
	rm -f "$PIDS/iperf3.pid"
	in_nas iperf3 -s -D -I "$PIDS/iperf3.pid" --logfile "$LOGS/iperf3.log"
	wait_until "iperf3 on port 5201" 10 listening "$NETNS_NAS" 5201
}

delayline_up() {
	local bin=$RUN/delayline args p
	if [[ ! -x $bin || $HERE/delayline.c -nt $bin ]]; then
		cc -O2 -Wall -Wextra -Werror -o "$bin.new" "$HERE/delayline.c"
		mv "$bin.new" "$bin"
	fi
	args=(-d "$DELAY_MS" -b 64)
	for p in "${DELAY_PORTS[@]}"; do
		args+=("$DELAY_IP:$p=$NAS_IP:$p")
	done
	if pid_alive delayline delayline "$NETNS_CLI" &&
		[[ "${args[*]}" == "$(cat "$RUN/delayline.args" 2>/dev/null)" ]] &&
		[[ ! $bin -nt $PIDS/delayline.pid ]]; then
		return 0
	fi
	stop_pid delayline delayline "$NETNS_CLI"
	# a delay line whose PID file was lost (run dir removed) still holds the ports
	for p in $(ip netns pids "$NS_CLI" 2>/dev/null || true); do
		if [[ $(cat "/proc/$p/comm" 2>/dev/null) == delayline ]]; then
			say "stopping a stray delay line ($p)"
			kill -TERM "$p" 2>/dev/null || true
		fi
	done
	for p in "${DELAY_PORTS[@]}"; do
		wait_until "port $p to be free in $NS_CLI" 5 not listening "$NETNS_CLI" "$p"
	done
	echo "${args[*]}" >"$RUN/delayline.args"
	start_bg delayline nsenter --net="$NETNS_CLI" -- setsid "$bin" "${args[@]}"
	for p in "${DELAY_PORTS[@]}"; do
		wait_until "the delay line on $DELAY_IP:$p" 5 listening "$NETNS_CLI" "$p"
	done
}

# the daemons nas.sh runs, in the order it starts them: NAME:COMM:NAMESPACE
# (nas or cli)
DAEMONS=(holder:sleep:nas rpcbind:rpcbind:nas ganesha:ganesha.nfsd:nas smbd:smbd:nas
	iperf3:iperf3:nas delayline:delayline:cli)

# daemon_do FN NAME:COMM:NS: FN NAME COMM NETNS_FILE (pid_alive, stop_pid)
daemon_do() {
	local name comm ns
	IFS=: read -r name comm ns <<<"$2"
	if [[ $ns == nas ]]; then ns=$NETNS_NAS; else ns=$NETNS_CLI; fi
	"$1" "$name" "$comm" "$ns"
}

# --- commands ------------------------------------------------------------------------
cmd_up() {
	install_packages
	mkdir -p "$RUN" "$PIDS" "$LOGS"
	chmod 0755 "$BASE" "$RUN"
	mkdir -p "$EXPORT_DIR" "$SHARE_DIR"
	chmod 0777 "$EXPORT_DIR" "$SHARE_DIR"
	net_up
	shape "$NS_CLI" "$VETH_CLI" sport
	shape "$NS_NAS" "$VETH_NAS" dport
	holder_up
	rpcbind_up
	ganesha_up
	samba_up
	iperf_up
	delayline_up
	save_state
	say "up: rate $RATE, flow cap $FLOW_CAP, delay ${DELAY_MS} ms one way; run dir $RUN"
	cmd_env
}

cmd_down() {
	local purge=$1
	local i
	if [[ -d $PIDS ]]; then
		for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do # last started first
			daemon_do stop_pid "${DAEMONS[i]}"
		done
	fi
	local ns
	for ns in "$NS_CLI" "$NS_NAS"; do
		if [[ -e /run/netns/$ns ]]; then
			sweep_netns "$ns"
			ip netns del "$ns"
		fi
	done
	rm -rf "$RUN"
	if ((purge)); then
		if [[ -e $USER_MARK ]] && id "$SMB_USER" >/dev/null 2>&1; then
			userdel "$SMB_USER"
		fi
		rm -rf "$BASE"
	fi
	say "down"
}


cmd_env() {
	[[ -f $RUN/state && -e $NETNS_CLI ]] || die "not up (run: $PROG up)"
	# A state file whose daemons are gone (the machine restarted, or one
	# crashed) is not up: a test that took it for up met no server.
	local d dead=()
	for d in "${DAEMONS[@]}"; do
		daemon_do pid_alive "$d" || dead+=("${d%%:*}")
	done
	((${#dead[@]} == 0)) || die "not up: ${dead[*]} not running (run: $PROG up)"
	local v3="nfs://$NAS_IP$NFS_PSEUDO?version=3" v4="nfs://$NAS_IP$NFS_PSEUDO?version=4"
	cat <<EOF
NAS_IP='$NAS_IP'
NAS_DELAY_IP='$DELAY_IP'
NAS_DELAY_MS='$DELAY_MS'
NAS_DELAY_PORTS='${DELAY_PORTS[*]}'
NAS_RATE='$RATE'
NAS_FLOW_CAP='$FLOW_CAP'
NAS_EXPORT_DIR='$EXPORT_DIR'
NAS_SHARE_DIR='$SHARE_DIR'
NFS_URL_V3='$v3'
NFS_URL_V4='$v4'
NFS_URL_V3_DELAY='${v3/$NAS_IP/$DELAY_IP}'
NFS_URL_V4_DELAY='${v4/$NAS_IP/$DELAY_IP}'
SMB_URL='smb://$SMB_USER@$NAS_IP/$SMB_SHARE'
SMB_URL_DELAY='smb://$SMB_USER@$DELAY_IP/$SMB_SHARE'
SMB_CRED_FILE='$RUN/smb.cred'
IPERF3_SERVER='$NAS_IP'
IPERF3_SERVER_DELAY='$DELAY_IP'
CLIENT_NETNS='$NETNS_CLI'
NAS_NETNS='$NETNS_NAS'
NAS_RUN_DIR='$RUN'
EOF
}

# iperf_gbits ADDR STREAMS: Gbit/s received over 2 s from the client namespace
iperf_gbits() {
	in_cli_net iperf3 -c "$1" -t 2 -P "$2" -f g 2>&1 |
		awk '/receiver/ { v = $(NF - 2) } END { if (v == "") exit 1; print v }'
}

# ms_of CMD...: wall time of CMD in milliseconds (fails if CMD fails)
ms_of() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >/dev/null 2>&1 || return 1
	t1=$(date +%s%N)
	echo $(((t1 - t0) / 1000000))
}

cmd_status() {
	local fail=0 name ns v g1 g4 a b
	if [[ ! -f $RUN/state ]]; then
		say "not up"
		return 1
	fi
	echo "settings: rate $RATE, flow cap $FLOW_CAP, delay $DELAY_MS ms one way"
	echo "export $EXPORT_DIR (NFS $NFS_PSEUDO), share $SHARE_DIR (SMB $SMB_SHARE)"
	for ns in "$NS_NAS" "$NS_CLI"; do
		if [[ -e /run/netns/$ns ]]; then echo "netns $ns: present"; else
			echo "netns $ns: MISSING"
			fail=1
		fi
	done
	for v in "${DAEMONS[@]}"; do
		name=${v%%:*}
		if daemon_do pid_alive "$v"; then
			printf '%-10s running, pid %s\n' "$name" "$(<"$PIDS/$name.pid")"
		else
			printf '%-10s NOT RUNNING\n' "$name"
			fail=1
		fi
	done
	echo "qdiscs: $VETH_CLI: $(tc -n "$NS_CLI" qdisc show dev "$VETH_CLI" 2>/dev/null | grep -c .) ($(tc -n "$NS_CLI" qdisc show dev "$VETH_CLI" 2>/dev/null | head -1)); $VETH_NAS: $(tc -n "$NS_NAS" qdisc show dev "$VETH_NAS" 2>/dev/null | grep -c .)"
	check() {
		local desc=$1
		shift
		if "$@" >"$RUN/check.out" 2>&1; then
			printf 'ok    %s\n' "$desc"
		else
			printf 'FAIL  %s\n' "$desc"
			sed 's/^/      /' "$RUN/check.out" | tail -5
			fail=1
		fi
	}
	local v3="nfs://$NAS_IP$NFS_PSEUDO?version=3" v4="nfs://$NAS_IP$NFS_PSEUDO?version=4"
	check "rpcinfo -p $NAS_IP (nfs 100003, mountd 100005)" \
		bash -c "nsenter --net=$NETNS_CLI -- rpcinfo -p $NAS_IP | grep -q ' 100005 '"
	check "nfs-ls $v3" in_cli_net nfs-ls "$v3"
	check "nfs-ls $v4" in_cli_net nfs-ls "$v4"
	check "nfs-ls ${v3/$NAS_IP/$DELAY_IP} (delay line)" in_cli_net nfs-ls "${v3/$NAS_IP/$DELAY_IP}"
	check "nfs-ls ${v4/$NAS_IP/$DELAY_IP} (delay line)" in_cli_net nfs-ls "${v4/$NAS_IP/$DELAY_IP}"
	check "smbclient //$NAS_IP/$SMB_SHARE -c ls" \
		in_cli_net smbclient "//$NAS_IP/$SMB_SHARE" -A "$RUN/smb.cred" -c ls
	check "smbclient //$DELAY_IP/$SMB_SHARE -c ls (delay line)" \
		in_cli_net smbclient "//$DELAY_IP/$SMB_SHARE" -A "$RUN/smb.cred" -c ls
	if a=$(ms_of in_cli_net smbclient "//$NAS_IP/$SMB_SHARE" -A "$RUN/smb.cred" -c ls) &&
		b=$(ms_of in_cli_net smbclient "//$DELAY_IP/$SMB_SHARE" -A "$RUN/smb.cred" -c ls); then
		echo "smbclient -c ls: $a ms direct, $b ms through the delay line"
	fi
	if g1=$(iperf_gbits "$NAS_IP" 1) && sleep 0.5 && g4=$(iperf_gbits "$NAS_IP" 4); then
		echo "iperf3 $NAS_IP 2 s: -P1 $g1 Gbit/s, -P4 $g4 Gbit/s"
	else
		echo "FAIL  iperf3 -c $NAS_IP"
		fail=1
	fi
	return "$fail"
}

# --- main ------------------------------------------------------------------------------
main() {
	local cmd=${1:-} purge=0
	[[ -n $cmd ]] || usage 2
	shift
	case $cmd in
	-h | --help | help) usage 0 ;;
	up | down | env | status | restart-nfs) ;;
	*)
		say "unknown command '$cmd'"
		usage 2
		;;
	esac
	[[ $cmd == env ]] || ((EUID == 0)) || die "needs root"
	load_state
	while (($#)); do
		case $1 in
		--rate | --flow-cap | --delay-ms | --export | --share)
			(($# >= 2)) || die "$1 needs a value"
			case $1 in
			--rate)
				[[ $2 == none ]] || valid_rate "$2" || die "bad --rate '$2' (e.g. 1gbit, 10gbit, 250mbit, none)"
				RATE=$2
				;;
			--flow-cap)
				[[ $2 == none ]] || valid_rate "$2" || die "bad --flow-cap '$2' (e.g. 250mbit, none)"
				FLOW_CAP=$2
				;;
			--delay-ms)
				[[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad --delay-ms '$2' (e.g. 0.5, 5)"
				DELAY_MS=$2
				;;
			--export) EXPORT_DIR=$(realpath -m "$2") ;;
			--share) SHARE_DIR=$(realpath -m "$2") ;;
			esac
			shift 2
			;;
		--purge)
			purge=1
			shift
			;;
		*) die "unknown option '$1' (try --help)" ;;
		esac
	done
	case $cmd in
	up) cmd_up ;;
	down) cmd_down "$purge" ;;
	env) cmd_env ;;
	status) cmd_status ;;
	restart-nfs)
		pid_alive ganesha ganesha.nfsd "$NETNS_NAS" || die "ganesha does not run (nas.sh up first)"
		set_in_nas
		stop_pid ganesha ganesha.nfsd "$NETNS_NAS"
		ganesha_up
		;;
	esac
}

main "$@"
