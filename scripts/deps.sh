#!/bin/bash
# deps.sh — install the Debian 12 packages ferryfs needs to build and test.
#
# Idempotent and quick: it asks dpkg-query first and does nothing when every
# package is installed. Otherwise it runs `apt-get update` (at most once per
# call, and only if the package lists are missing or an install fails on
# them) and `apt-get install -y --no-install-recommends` of what is missing.
# Needs root (or sudo) only when something has to be installed.
#
# Usage: scripts/deps.sh [--test] [EXTRA_PACKAGE...]
#   --test  also the servers the tests bring up in network namespaces
#           (nfs-ganesha, samba, iperf3; the demo does not need them, and
#           on a plain Debian installing them starts their services), and
#           the packaging tests' tools (mandoc, man-db, systemd for
#           systemd-analyze, bash-completion; debhelper, lintian,
#           fakeroot, dpkg-dev for scripts/package.sh: tests/pkg/)
set -euo pipefail

PACKAGES=(
	build-essential cmake pkg-config git
	libfuse3-dev fuse3
	liburing-dev
	liblmdb-dev lmdb-utils
	libcmocka-dev
	libssl-dev
	clang libclang-rt-14-dev
	rsync attr sqlite3 util-linux mount xz-utils
	libnfs-dev libnfs-utils iproute2
	libsmbclient-dev
	libjansson-dev
)
if [[ "${1:-}" == --test ]]; then
	shift
	PACKAGES+=(nfs-ganesha nfs-ganesha-vfs rpcbind samba smbclient iperf3)
	PACKAGES+=(mandoc man-db systemd bash-completion)
	PACKAGES+=(debhelper lintian fakeroot dpkg-dev)
fi
PACKAGES+=("$@")

missing=()
for p in "${PACKAGES[@]}"; do
	status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[[ "$status" == installed ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
	echo "deps: all ${#PACKAGES[@]} packages installed"
	exit 0
fi

echo "deps: installing: ${missing[*]}"

SUDO=()
if ((EUID != 0)); then
	if command -v sudo >/dev/null 2>&1; then
		SUDO=(sudo)
	else
		echo "deps: missing packages and not root (run as root or with sudo)" >&2
		exit 1
	fi
fi

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold
	-o Dpkg::Use-Pty=0 -o APT::Color=0)
updated=0

apt_update() {
	((updated)) && return 0
	"${SUDO[@]}" apt-get "${APT_OPTS[@]}" -q update
	updated=1
}

# No package lists at all (fresh image): update before the first try.
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
	apt_update
fi

apt_install() {
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
		apt-get "${APT_OPTS[@]}" -q install -y --no-install-recommends \
		"${missing[@]}" </dev/null
}

if ! apt_install; then
	# Lists too old (package versions gone from the mirror): update once.
	((updated)) && exit 1
	apt_update
	apt_install
fi
echo "deps: done"
