# shellcheck shell=bash disable=SC2034 # sets variables for its caller
# nas_lib.sh - an NFS server of our own in network namespaces, for the
# integration tests (sourced by nfs_suite.sh and it_agent.sh; not run).
#
# The caller sets, before calling anything here:
#   NS_NAS NS_CLI      the two network namespaces (must not exist yet)
#   IP_NAS IP_CLI      their addresses (a /24 between them)
#   VETH_NAS VETH_CLI  the two ends of the veth that joins them
#   W                  a temp dir of ours (0755): the export, logs, config
#   log()              prints one line
# and may set NAS_EXPORT_EXTRA (more lines for ganesha's EXPORT block) and
# NAS_DETACH_FUSE=1: the server's mount namespace made private (no later
# mount of the host propagates into it) and the FUSE mounts copied into it
# from the host's detached there (umount -l), so that a FUSE mount made,
# killed or unmounted on the host is never held or met by ganesha.
#
# nas_need_packages   installs nfs-ganesha, nfs-ganesha-vfs, rpcbind if
#                     missing (apt-get); 1 if that is not possible
# nas_own_up          namespaces NS_NAS and NS_CLI joined by the veth
#                     (nothing in the host's namespace); in NS_NAS, with a
#                     private /run, rpcbind and nfs-ganesha (FSAL VFS,
#                     NFSv3 and NFSv4, Squash = No_Root_Squash, numeric
#                     owners) exporting $W/export as /export. Sets
#                     nas_own=1 (nas_own_down has something to do),
#                     NFS_URL (nfs://IP_NAS/export), NFS_DIR ($W/export),
#                     CLIENT_NETNS (/run/netns/NS_CLI) and RESTART (a
#                     script that restarts ganesha; serve.sh starts it
#                     again until $W/stop exists)
# nas_wait            until the server answers MOUNT and NFS from NS_CLI
# nas_own_down        the processes in both namespaces killed by pid (ip
#                     netns pids: TERM, then KILL after 5 s), the
#                     namespaces deleted; for a cleanup trap (unmount
#                     FUSE mounts served from NS_CLI before)
# in_cli CMD...       runs CMD in NS_CLI (nsenter --net: the host's mount
#                     namespace, so a FUSE mount made there is seen here)

nas_own=0

nas_need_packages() {
	local missing=()
	command -v ganesha.nfsd >/dev/null || missing+=(nfs-ganesha)
	[ -e /usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so ] ||
		ls /usr/lib/*/ganesha/libfsalvfs.so >/dev/null 2>&1 ||
		missing+=(nfs-ganesha-vfs)
	command -v rpcbind >/dev/null || missing+=(rpcbind)
	command -v rpcinfo >/dev/null || missing+=(rpcbind)
	[ ${#missing[@]} = 0 ] && return 0
	log "installing ${missing[*]}"
	if ! command -v apt-get >/dev/null ||
		! DEBIAN_FRONTEND=noninteractive apt-get install -y \
			--no-install-recommends "${missing[@]}" >"$W/apt.log" 2>&1; then
		tail -n 5 "$W/apt.log" 2>/dev/null
		return 1
	fi
	# the package starts a system ganesha and rpcbind: not ours to keep
	# running in the host's namespace, but not ours to stop either
	return 0
}

# in_cli CMD...: run in the client namespace (CLIENT_NETNS: its path)
in_cli() { nsenter --net="$CLIENT_NETNS" "$@"; }

nas_own_up() {
	local plugins ns
	plugins=$(dirname "$(ls /usr/lib/*/ganesha/libfsalvfs.so 2>/dev/null | head -n 1)")
	for ns in $NS_NAS $NS_CLI; do
		if [ -e "/run/netns/$ns" ]; then
			log "error: namespace $ns exists (another run of this test, or a stale one: ip netns pids $ns; ip netns del $ns)"
			return 1
		fi
	done
	nas_own=1
	mkdir -m 0755 "$W/export" "$W/recov"
	ip netns add "$NS_NAS" && ip netns add "$NS_CLI" &&
		ip link add "$VETH_CLI" type veth peer name "$VETH_NAS" &&
		ip link set "$VETH_CLI" netns "$NS_CLI" &&
		ip link set "$VETH_NAS" netns "$NS_NAS" &&
		ip -n "$NS_CLI" addr add "$IP_CLI/24" dev "$VETH_CLI" &&
		ip -n "$NS_NAS" addr add "$IP_NAS/24" dev "$VETH_NAS" &&
		ip -n "$NS_CLI" link set "$VETH_CLI" up &&
		ip -n "$NS_NAS" link set "$VETH_NAS" up &&
		ip -n "$NS_CLI" link set lo up &&
		ip -n "$NS_NAS" link set lo up || {
		log "error: cannot set up the network namespaces"
		return 1
	}
	cat >"$W/ganesha.conf" <<EOF
NFS_CORE_PARAM {
	Protocols = 3, 4;
	Bind_addr = $IP_NAS;
	Enable_NLM = false;
	Enable_RQUOTA = false;
	NFS_Port = 2049;
	MNT_Port = 20048;
	mount_path_pseudo = true;
	Plugins_Dir = $plugins;
}
NFSV4 {
	Graceless = true;
	Only_Numeric_Owners = true;
	RecoveryBackend = fs;
	RecoveryRoot = $W/recov;
}
EXPORT {
	Export_Id = 1;
	Path = $W/export;
	Pseudo = /export;
	Access_Type = RW;
	Squash = No_Root_Squash;
	Protocols = 3, 4;
	Transports = TCP;
	SecType = sys;
	FSAL { Name = VFS; }
${NAS_EXPORT_EXTRA:-}
}
LOG { Default_Log_Level = EVENT; }
EOF
	# runs in the nas namespace with a mount namespace of its own
	# (ip netns exec makes one): a private /run, so that rpcbind's
	# socket and ganesha's pid file are not the host's. ganesha is
	# started again when it exits, until $W/stop exists: killing it is
	# a server restart (restart.sh, for it_nfs).
	cat >"$W/serve.sh" <<'EOF'
#!/bin/bash
W=$1
mount -t tmpfs -o mode=0755 "$3-run" /run || exit 1
if [ "$4" = 1 ]; then
	mount --make-rprivate / || exit 1
	# mountinfo: field 5 the mount point (octal escapes), the fstype
	# after the "-" that ends the optional fields; deepest first
	awk '{ for (i = 7; i < NF; i++) if ($i == "-") {
		if ($(i + 1) ~ /^fuse/) print $5; break } }' /proc/self/mountinfo |
		sort -r | while IFS= read -r m; do
		umount -l "$(printf '%b' "$m")" 2>/dev/null
	done
fi
mkdir -p /run/ganesha /run/rpcbind
rpcbind -f -h "$2" >"$W/rpcbind.log" 2>&1 &
sleep 0.3
while [ ! -e "$W/stop" ]; do
	ganesha.nfsd -F -f "$W/ganesha.conf" -L "$W/ganesha.log" \
		-p /run/ganesha/ganesha.pid -N NIV_EVENT &
	echo $! >"$W/ganesha.pid"
	wait $!
	sleep 0.2
done
EOF
	cat >"$W/restart.sh" <<EOF
#!/bin/sh
# stop ganesha and return once it is gone; serve.sh starts it again
# (the client's calls wait meanwhile)
pid=\$(cat "$W/ganesha.pid") && kill -TERM "\$pid" || exit 1
while kill -0 "\$pid" 2>/dev/null; do sleep 0.05; done
EOF
	chmod +x "$W/serve.sh" "$W/restart.sh"
	setsid ip netns exec "$NS_NAS" "$W/serve.sh" "$W" "$IP_NAS" "$NS_NAS" \
		"${NAS_DETACH_FUSE:-0}" </dev/null >"$W/serve.log" 2>&1 &
	NFS_URL=nfs://$IP_NAS/export
	NFS_DIR=$W/export
	CLIENT_NETNS=/run/netns/$NS_CLI
	RESTART=$W/restart.sh
	return 0
}

# The server answers MOUNT and NFS (rpcinfo from the client namespace).
nas_wait() {
	local host=${NFS_URL#nfs://}
	host=${host%%/*}
	for _ in $(seq 1 300); do
		if in_cli rpcinfo -t "$host" nfs 3 >/dev/null 2>&1 &&
			in_cli rpcinfo -t "$host" mountd 3 >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.1
	done
	log "error: no NFS server at $host after 30 s"
	[ -n "$W" ] && tail -n 20 "$W/ganesha.log" "$W/serve.log" 2>/dev/null
	return 1
}

nas_own_down() {
	local pid ns
	[ "$nas_own" = 1 ] || return 0
	[ -n "$W" ] && : >"$W/stop"
	for ns in $NS_NAS $NS_CLI; do
		[ -e "/run/netns/$ns" ] || continue
		for pid in $(ip netns pids "$ns" 2>/dev/null); do
			kill -TERM "$pid" 2>/dev/null
		done
	done
	for _ in $(seq 1 50); do
		[ -z "$(ip netns pids "$NS_NAS" 2>/dev/null)$(ip netns pids "$NS_CLI" 2>/dev/null)" ] && break
		sleep 0.1
	done
	for ns in $NS_NAS $NS_CLI; do
		[ -e "/run/netns/$ns" ] || continue
		for pid in $(ip netns pids "$ns" 2>/dev/null); do
			kill -KILL "$pid" 2>/dev/null
		done
		ip netns del "$ns" 2>/dev/null
	done
}
