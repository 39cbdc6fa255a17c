#!/bin/bash
# it_package.sh BUILD_DIR - the Debian packages, built, installed, used
# and removed again.
#
# Registered with ctest (labels "mount;pkg", ~40 s: the package build is
# ~20 s of it). As root on a Debian machine:
#   1. scripts/package.sh BUILD_DIR/deb: dpkg-buildpackage -b of the tree
#      and lintian with no error or warning (the .debs stay in
#      BUILD_DIR/deb, for CI to keep as artifacts);
#   2. `apt-get install ./ferryfs_*.deb ./ferry-agent_*.deb`: exit 0, the
#      files where the packages put them, /etc/default/ferry-agent a
#      conffile; `man ferryfs`, `man ferry-agent` and `man
#      mount.fuse.ferryfs` found and rendered without warnings;
#      `systemd-analyze verify` of the installed units (ExecStart= and
#      the man pages of Documentation= as installed); the installed bash
#      completion offers -o options;
#   3. an fstab line of type fuse.ferryfs with _netdev, x-systemd.*
#      options and `mount -T FSTAB MNT` with no PATH (env -i): mounted
#      by /sbin/mount.fuse.ferryfs and /usr/bin/ferryfs of the package;
#      with the flush paused, umount(8) leaves the journal with the data;
#      mounted again, `flush --wait` puts it on the share (SHA-256);
#   4. `apt-get purge ferryfs ferry-agent`: nothing of them is left, the
#      machine is as before (the other tests use BUILD_DIR's binaries).
# The packages are removed on every exit. Prints "ok N - name" / "not ok
# N - name: detail", then "N passed, M failed". Exit 1 on failure, 77
# without root, /dev/fuse, dpkg/apt-get, or when ferryfs or ferry-agent
# is installed already (not ours to replace).
set -u
# shellcheck source=tests/pkg/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ $# -ne 1 ]; then
	echo "usage: it_package.sh BUILD_DIR" >&2
	exit 2
fi
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ]; then
	echo "# skip: needs root"
	exit 77
fi
if [ ! -c /dev/fuse ]; then
	echo "# skip: no /dev/fuse"
	exit 77
fi
for tool in dpkg apt-get systemd-analyze; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "# skip: no $tool"
		exit 77
	fi
done
installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
for p in ferryfs ferry-agent; do
	if installed "$p"; then
		echo "# skip: the package $p is installed already"
		exit 77
	fi
done

T=$(mktemp -d /tmp/ferryfs-package.XXXXXX) || exit 1
chmod 0755 "$T"
R=$T/share
M=$T/mnt
J=$T/journal
OUT=$BUILD/deb
mkdir -p "$R" "$M"
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -q -y -o Dpkg::Use-Pty=0 -o APT::Color=0)

cleanup() {
	umount "$M" 2>/dev/null
	for p in $(pgrep -f -- "ferryfs mount $R " 2>/dev/null); do
		kill -9 "$p" 2>/dev/null
	done
	if installed ferryfs || installed ferry-agent ||
		dpkg -l ferryfs ferry-agent 2>/dev/null | grep -q '^rc'; then
		"${APT[@]}" purge ferryfs ferry-agent >>"$T/apt.log" 2>&1
	fi
	rm -rf "$T"
}
trap cleanup EXIT
finish() {
	tally
	exit
}
field() { findmnt -n -o "$2" --mountpoint "$1" 2>/dev/null | tail -n 1; }
wait_gone() {
	local _
	for _ in $(seq 1 100); do
		pgrep -f -- "ferryfs mount $R " >/dev/null || return 0
		sleep 0.1
	done
	return 1
}

# --- 1. build ---------------------------------------------------------------
start=$(date +%s)
"$SRC/scripts/package.sh" "$OUT" >"$T/package.log" 2>&1
rc=$?
check "scripts/package.sh: built, lintian clean ($(($(date +%s) - start)) s)" \
	"exit $rc: $(tail -n 20 "$T/package.log" | tr '\n' '|')" [ "$rc" = 0 ]
debs=$(cd "$OUT" 2>/dev/null && ls ferryfs_*.deb ferry-agent_*.deb 2>/dev/null | grep -v dbgsym)
check "two packages: ferryfs, ferry-agent" "$(ls "$OUT" 2>&1 | tr '\n' ' ')" \
	[ "$(echo "$debs" | wc -w)" = 2 ]
[ "$nfail" = 0 ] || finish

# --- 2. install ---------------------------------------------------------------
# shellcheck disable=SC2046
(cd "$OUT" && "${APT[@]}" install $(for d in $debs; do echo "./$d"; done)) >"$T/apt.log" 2>&1
rc=$?
both=no
installed ferryfs && installed ferry-agent && both=yes
check "apt-get install ./ferryfs_*.deb ./ferry-agent_*.deb" \
	"exit $rc, both installed: $both: $(tail -n 5 "$T/apt.log" | tr '\n' '|')" \
	[ "$rc" = 0 -a "$both" = yes ]
for f in /usr/bin/ferryfs /usr/sbin/mount.fuse.ferryfs /usr/bin/ferry-agent; do
	check "installed: $f" "$(ls -l "$f" 2>&1)" test -x "$f"
done
for f in /sbin/mount.ferryfs /lib/systemd/system/ferryfs-flush@.service \
	/lib/systemd/system/ferry-agent@.service \
	/usr/share/bash-completion/completions/ferryfs /etc/default/ferry-agent; do
	check "installed: $f" "$(ls -l "$f" 2>&1)" test -e "$f"
done
check "/etc/default/ferry-agent is a conffile" "$(dpkg-query -W -f='${Conffiles}' ferry-agent)" \
	grep -q /etc/default/ferry-agent <<<"$(dpkg-query -W -f='${Conffiles}' ferry-agent)"
for page in ferryfs ferry-agent mount.fuse.ferryfs mount.ferryfs; do
	out=$(MANWIDTH=80 man --warnings -E UTF-8 8 "$page" 2>&1 >/dev/null)
	rc=$?
	check "man 8 $page: found, no warning" "exit $rc: $out" [ "$rc" = 0 -a -z "$out" ]
done
mkdir -p "$T/verify"
MINST=$(systemd-escape --path "$M")
cp /lib/systemd/system/ferry-agent@.service "$T/verify/ferry-agent@srv-export.service"
cp /lib/systemd/system/ferryfs-flush@.service "$T/verify/ferryfs-flush@$MINST.service"
printf '%s %s fuse.ferryfs defaults,_netdev,x-systemd.requires=/,x-systemd.automount,streams=2,journal=%s 0 0\n' \
	"$R" "$M" "$J" >"$T/fstab"
# the flush unit is BindsTo= its mount's unit: a generated one, from our
# fstab over /etc/fstab in a mount namespace of its own
out=$(unshare --mount --propagation private sh -c \
	'mount --bind "$1" /etc/fstab && systemd-analyze verify --generators=yes "$2"/*' \
	verify "$T/fstab" "$T/verify" 2>&1)
rc=$?
check "systemd-analyze verify of the installed units" "exit $rc: $(echo "$out" | tr '\n' '|')" \
	[ "$rc" = 0 -a -z "$out" ]
out=$(bash --norc --noprofile -c '
	. /usr/share/bash-completion/bash_completion
	. /usr/share/bash-completion/completions/ferryfs
	compopt() { :; }
	COMP_WORDS=(ferryfs mount /r /m -o stre); COMP_CWORD=5
	COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
	_ferryfs ferryfs; echo "${COMPREPLY[*]}"' 2>&1)
check "the installed bash completion: -o stre<TAB> -> streams=" "got '$out'" \
	[ "$out" = streams= ]

# --- 3. fstab and mount(8) with the package's files -----------------------------
out=$(env -i /usr/bin/mount -T "$T/fstab" "$M" 2>&1)
rc=$?
check "fstab line, mount -T FSTAB MNT (env -i): exit 0, type fuse.ferryfs" \
	"exit $rc: $out, type '$(field "$M" FSTYPE)'" \
	[ "$rc" = 0 -a "$(field "$M" FSTYPE)" = fuse.ferryfs ]
if [ "$(field "$M" FSTYPE)" = fuse.ferryfs ]; then
	pid=$(pgrep -f -- "ferryfs mount $R " | head -n 1)
	check "the daemon is the package's /usr/bin/ferryfs" \
		"$(readlink "/proc/${pid:-0}/exe")" \
		[ "$(readlink "/proc/${pid:-0}/exe")" = /usr/bin/ferryfs ]
	/usr/bin/ferryfs pause "$M" >/dev/null
	head -c $((4 << 20)) /dev/urandom >"$T/f.src"
	cp "$T/f.src" "$M/f" && sync "$M/f"
	out=$(umount "$M" 2>&1)
	rc=$?
	wait_gone
	check "paused, umount(8): exit 0, the journal keeps the data" \
		"exit $rc: $out; share: $(ls "$R")" \
		[ "$rc" = 0 -a -s "$J/meta.mdb" -a ! -e "$R/f" ]
	env -i /usr/bin/mount -T "$T/fstab" "$M" >/dev/null 2>&1
	/usr/bin/ferryfs resume "$M" >/dev/null
	out=$(timeout 60 /usr/bin/ferryfs flush "$M" --wait 2>&1)
	rc=$?
	check "mounted again, flush --wait: the share has the data (SHA-256)" \
		"exit $rc: $out" \
		[ "$rc" = 0 -a "$(sha256sum <"$T/f.src")" = "$(sha256sum <"$R/f" 2>/dev/null)" ]
	umount "$M"
	wait_gone
fi
out=$(/usr/bin/ferry-agent --help 2>&1)
check "ferry-agent --help runs" "exit $?: $out" grep -q -- --root <<<"$out"

# --- 4. remove ----------------------------------------------------------------
"${APT[@]}" purge ferryfs ferry-agent >"$T/apt.log" 2>&1
rc=$?
check "apt-get purge ferryfs ferry-agent" "exit $rc: $(tail -n 3 "$T/apt.log" | tr '\n' '|')" \
	[ "$rc" = 0 ]
left=$(ls -d /usr/bin/ferryfs /usr/bin/ferry-agent /usr/sbin/mount.fuse.ferryfs \
	/usr/sbin/mount.ferryfs /etc/default/ferry-agent /lib/systemd/system/ferry*@.service \
	/usr/share/bash-completion/completions/ferryfs /usr/share/man/man8/ferry* 2>/dev/null)
check "nothing of the packages is left" "left: $left" \
	[ -z "$left" -a -z "$(dpkg -l ferryfs ferry-agent 2>/dev/null | grep -E '^(ii|rc)')" ]
finish
