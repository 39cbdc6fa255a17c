#!/bin/bash
# nfs_server.sh up|down DIR TAG - the NFS server of `crashcheck.py --share
# nfs` (tests/crash/README.md), through tests/it/nas_lib.sh (the one of
# nfs_suite.sh's own server). Not a test; as root.
#
#   up DIR TAG    network namespaces ffcr<TAG>-nas (10.79.0.2) and
#                 ffcr<TAG>-cli (10.79.0.1) joined by a veth, and in the
#                 first rpcbind and nfs-ganesha (FSAL VFS, NFSv3 and 4,
#                 Squash = No_Root_Squash, numeric owners) exporting
#                 DIR/export as /export, its mount namespace private and
#                 the host's FUSE mounts detached there (NAS_DETACH_FUSE);
#                 returns once the server answers MOUNT and NFS from the
#                 client namespace, the server left running, and prints
#                 NFS_URL=, NFS_DIR=, CLIENT_NETNS= lines. On a failure
#                 what it set up is taken down again.
#   down DIR TAG  the processes of both namespaces killed (by pid: ip
#                 netns pids), the namespaces deleted (also when DIR is
#                 gone). DIR is left.
#
# DIR: an empty directory of the caller's (0755); TAG: a short word (the
# caller's pid), so that two runs have namespaces of their own (their
# addresses are the same, each pair alone on its veth).
# Exit 0; 77 if nfs-ganesha, its VFS FSAL or rpcbind is not installed and
# cannot be (apt-get); 1 if the server did not come up; 2 on a usage error.
set -u
cmd=${1:-}
W=${2:-}
TAG=${3:-}
if [ -z "$W" ] || [ -z "$TAG" ] || { [ "$cmd" = up ] && [ ! -d "$W" ]; } ||
	{ [ "$cmd" != up ] && [ "$cmd" != down ]; }; then
	echo "usage: nfs_server.sh up|down DIR TAG" >&2
	exit 2
fi
# shellcheck disable=SC2034 # read by nas_lib.sh
NS_NAS=ffcr$TAG-nas
NS_CLI=ffcr$TAG-cli
IP_NAS=10.79.0.2
IP_CLI=10.79.0.1
VETH_NAS=ffcr${TAG}n
VETH_CLI=ffcr${TAG}c
NAS_DETACH_FUSE=1
log() { printf 'nfs_server: %s\n' "$*" >&2; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/it/nas_lib.sh
. "$ROOT/tests/it/nas_lib.sh"

if [ "$cmd" = down ]; then
	# DIR may be gone: the namespaces and their pids are enough
	[ -d "$W" ] || W=
	# shellcheck disable=SC2034 # read by nas_own_down
	nas_own=1
	nas_own_down
	exit 0
fi
if ! nas_need_packages >&2; then
	log "skip: nfs-ganesha, nfs-ganesha-vfs, rpcbind not installed"
	exit 77
fi
if ! nas_own_up >&2 || ! nas_wait >&2; then
	nas_own_down
	exit 1
fi
echo "NFS_URL=$NFS_URL"
echo "NFS_DIR=$NFS_DIR"
echo "CLIENT_NETNS=$CLIENT_NETNS"
exit 0
