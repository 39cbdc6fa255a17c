#!/bin/bash
# it_mount_helper.sh BUILD_DIR - mount(8), fstab and umount(8) with the
# installed files, as a package lays them out.
#
# Registered with ctest (labels "mount;pkg", ~10 s). Installs BUILD_DIR
# with `cmake --install --prefix /usr` into a DESTDIR, then, in a private
# mount namespace, lays that tree's /usr/bin and /usr/sbin over the
# system's (overlayfs: the rest of the machine sees nothing of it), so that
# mount(8) finds /sbin/mount.fuse.ferryfs where a package puts it. There:
#   - the helper alone: -fv prints the ferryfs command without the options
#     of mount(8), fstab and systemd (_netdev, nofail, x-systemd.*, ...);
#   - `mount -t fuse.ferryfs R M -o _netdev,nofail,...` with no PATH at all
#     (env -i) mounts, type fuse.ferryfs, source R;
#   - with the flush paused, files written and fsynced, `umount M` (umount(8))
#     ends the daemon and leaves the journal with the data not on the share;
#   - an fstab line with _netdev, x-systemd.requires=, x-systemd.automount
#     and `mount -T FSTAB M` mounts that journal again: the files are there,
#     `ferryfs flush M --wait` exits 0 and the share has them (SHA-256);
#   - `mount -t ferryfs` (the mount.ferryfs link) and `mount -f` (fake:
#     nothing mounted).
# Prints "ok N - name" / "not ok N - name: detail", then "N passed,
# M failed". Exit 1 on failure, 77 without root, /dev/fuse, unshare or
# overlayfs.
set -u
# shellcheck source=tests/pkg/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ "${1:-}" != --inner ]; then
	if [ $# -ne 1 ]; then
		echo "usage: it_mount_helper.sh BUILD_DIR" >&2
		exit 2
	fi
	if [ "$(id -u)" != 0 ]; then
		echo "# skip: needs root"
		exit 77
	fi
	pkg_ns_run helper "$1" "$0" share
fi

# --- inside the private mount namespace -------------------------------------
T=$2
R=$T/share
M=$T/mnt
J=$T/journal
mkdir -p "$R" "$M"

finish() {
	umount "$M" 2>/dev/null
	tally
	exit
}
field() { # field MNT COLUMN: findmnt's COLUMN of the mount at MNT
	findmnt -n -o "$2" --mountpoint "$1" 2>/dev/null | tail -n 1
}
daemon_pids() { pgrep -f -- "ferryfs mount $R " 2>/dev/null; }
wait_gone() {
	local _
	for _ in $(seq 1 100); do
		[ -z "$(daemon_pids)" ] && return 0
		sleep 0.1
	done
	return 1
}

for d in bin sbin; do
	if ! mount -t overlay overlay -o "lowerdir=$T/root/usr/$d:/usr/$d" "/usr/$d"; then
		notok "overlay the installed /usr/$d" "mount -t overlay failed"
		finish
	fi
done
check "installed layout: /sbin/mount.fuse.ferryfs, /usr/bin/ferryfs" \
	"$(ls -l /sbin/mount.fuse.ferryfs /usr/bin/ferryfs 2>&1)" \
	test -x /sbin/mount.fuse.ferryfs -a -x /usr/bin/ferryfs -a -L /sbin/mount.ferryfs

# the helper alone: what it runs
out=$(env -i /sbin/mount.fuse.ferryfs "$R" "$M" -fv -o \
	rw,defaults,_netdev,nofail,noauto,user,x-systemd.automount,x-systemd.requires=/srv,comment=x,streams=2,noatime -t fuse.ferryfs 2>&1)
want="mount.fuse.ferryfs: /sbin/../bin/ferryfs mount $R $M -o streams=2,noatime"
check "helper -fv: the command, mount(8)'s and systemd's options dropped" \
	"got '$out'" [ "$out" = "$want" ]
check "helper -f: nothing mounted" "mounted" [ -z "$(field "$M" FSTYPE)" ]
out=$(env -i /sbin/mount.fuse.ferryfs "$R" 2>&1)
rc=$?
check "helper with one argument: exit 1 and the usage" "exit $rc, '$out'" \
	[ "$rc" = 1 -a -n "$out" ]

# mount(8), no PATH: /sbin/mount.fuse.ferryfs, and ferryfs beside it
out=$(env -i /usr/bin/mount -t fuse.ferryfs "$R" "$M" \
	-o "_netdev,nofail,streams=2,journal=$J,noatime" 2>&1)
rc=$?
check "mount -t fuse.ferryfs (env -i): exit 0" "exit $rc: $out" [ "$rc" = 0 ]
check "mount -t fuse.ferryfs: type fuse.ferryfs" "'$(field "$M" FSTYPE)'" \
	[ "$(field "$M" FSTYPE)" = fuse.ferryfs ]
check "mount -t fuse.ferryfs: source is the share" "'$(field "$M" SOURCE)'" \
	[ "$(field "$M" SOURCE)" = "$R" ]
if [ "$(field "$M" FSTYPE)" != fuse.ferryfs ]; then
	finish
fi

# data pending in the journal, then umount(8)
ferryfs pause "$M" >/dev/null 2>&1
check "ferryfs pause" "exit $?" true
head -c $((6 << 20)) /dev/urandom >"$T/big.src"
mkdir "$M/dir" && cp "$T/big.src" "$M/dir/big" && echo small >"$M/small" &&
	sync "$M/dir/big" "$M/small"
check "write and fsync through the mount" "exit $?" [ -s "$M/dir/big" ]
sleep 0.5
check "paused: the data is not on the share" "$(ls -R "$R")" \
	[ ! -e "$R/dir/big" ]
out=$(umount "$M" 2>&1)
rc=$?
check "umount(8): exit 0" "exit $rc: $out" [ "$rc" = 0 ]
check "umount(8): the daemon ends" "pids $(daemon_pids)" wait_gone
check "umount(8): the journal stays" "$(ls "$J" 2>&1)" [ -s "$J/meta.mdb" ]

# fstab, as systemd's mount units give it to mount(8)
printf '%s %s fuse.ferryfs defaults,_netdev,x-systemd.requires=/,x-systemd.automount,streams=2,journal=%s 0 0\n' \
	"$R" "$M" "$J" >"$T/fstab"
out=$(env -i /usr/bin/mount -T "$T/fstab" "$M" 2>&1)
rc=$?
check "fstab line (mount -T FSTAB MNT, env -i): exit 0" "exit $rc: $out" \
	[ "$rc" = 0 ]
check "fstab: mounted, type fuse.ferryfs" "'$(field "$M" FSTYPE)'" \
	[ "$(field "$M" FSTYPE)" = fuse.ferryfs ]
check "remount: the journal's files are there" "cmp failed" \
	cmp -s "$T/big.src" "$M/dir/big"
ferryfs resume "$M" >/dev/null 2>&1
out=$(timeout 60 ferryfs flush "$M" --wait 2>&1)
rc=$?
check "ferryfs flush --wait: exit 0" "exit $rc: $out" [ "$rc" = 0 ]
check "the share has the files (SHA-256)" \
	"$(sha256sum "$T/big.src" "$R/dir/big" 2>&1 | tr '\n' ' ')" \
	[ "$(sha256sum <"$T/big.src")" = "$(sha256sum <"$R/dir/big" 2>/dev/null)" \
	-a "$(cat "$R/small" 2>/dev/null)" = small ]
out=$(umount "$M" 2>&1)
check "umount(8) after the flush" "$out" wait_gone

# type ferryfs (mount.ferryfs), and mount -f
out=$(env -i /usr/bin/mount -t ferryfs "$R" "$M" -o "journal=$J" 2>&1)
rc=$?
check "mount -t ferryfs: exit 0, type fuse.ferryfs" \
	"exit $rc: $out, '$(field "$M" FSTYPE)'" \
	[ "$rc" = 0 -a "$(field "$M" FSTYPE)" = fuse.ferryfs ]
check "mount -t ferryfs: the share's files" "ls: $(ls "$M" 2>&1)" \
	[ "$(cat "$M/small" 2>/dev/null)" = small ]
umount "$M" 2>/dev/null
wait_gone
out=$(env -i /usr/bin/mount -f -t fuse.ferryfs "$R" "$M" 2>&1)
rc=$?
check "mount -f -t fuse.ferryfs: exit 0, nothing mounted" \
	"exit $rc: $out, '$(field "$M" FSTYPE)'" \
	[ "$rc" = 0 -a -z "$(field "$M" FSTYPE)" ]
finish
