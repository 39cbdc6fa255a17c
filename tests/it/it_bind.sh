#!/bin/bash
# it_bind.sh FERRYFS - a journal is bound to its share, and a damaged
# journal is refused (issue 36, bugs 2 and 3). As root (ctest, label
# "mount"); each check says what it found.
#
#  1. The share a mount point not mounted at the time: the journal's share
#     R is moved away and an empty directory takes its path. Mounting the
#     journal there must fail with one line naming -o adopt, and put
#     nothing into the empty directory; with R back, the flush finishes.
#     (On 57bd6a8 the mount went on, flushed the pending file into the
#     empty directory and `flush --wait` said everything was on the
#     remote.) -o adopt binds the journal to what is at the path on
#     purpose; the old share is then refused.
#  2. Two journals on one share: each has its own marker; both remount.
#  3. The marker (.ferryfs/ at the share's root) is hidden through the
#     mount, in write-back and write-through: not listed, not found, not
#     made.
#  4. A share root that cannot be written (chattr +i): the journal is
#     bound to the root's identity, said on stderr; another directory is
#     then refused.
#  5. An emptied LMDB file (meta.mdb/data.mdb truncated to 0 after a
#     kill -9, with 3 MB fsynced and pending): the mount is refused, the
#     staging data stays. (On 57bd6a8 the mount began a new journal and
#     the data was gone.)
#
# Exit 0 if every check passed, 1 if not, 77 without root or /dev/fuse.
set -u

FERRYFS=${1:?usage: it_bind.sh FERRYFS}
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ] ||
	! command -v fusermount3 >/dev/null; then
	echo "it_bind: skip: needs root, /dev/fuse and fusermount3"
	exit 77
fi
FERRYFS=$(readlink -f "$FERRYFS")
T=$(mktemp -d /var/tmp/ferryfs-bind.XXXXXX) || exit 1
R=$T/share M=$T/mnt J=$T/journal
mkdir -p "$R" "$M"
pass=0
fail=0
DPID=

ok() { pass=$((pass + 1)); echo "ok $((pass + fail)) - $1"; }
bad() { fail=$((fail + 1)); echo "not ok $((pass + fail)) - $1: $2"; }

is_mounted() {
	awk -v m="$M" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo
}

cleanup() {
	chattr -i "$T"/ro "$T"/ro2 2>/dev/null
	[ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null
	wait 2>/dev/null
	is_mounted && { fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"; }
	if [ "$fail" = 0 ]; then rm -rf "$T"; else echo "# kept $T"; fi
}
trap cleanup EXIT

# mount_fg SHARE JOURNAL [OPTS]: the daemon in the foreground, our child;
# returns 1 (and prints its stderr to $T/err) if it did not mount
mount_fg() {
	"$FERRYFS" mount "$1" "$M" -f -o "journal=$2,cache=off${3:+,$3}" \
		>"$T/err" 2>&1 &
	DPID=$!
	for _ in $(seq 1 200); do
		is_mounted && return 0
		kill -0 "$DPID" 2>/dev/null || break
		sleep 0.025
	done
	wait "$DPID" 2>/dev/null
	DPID=
	return 1
}

umount_fg() {
	fusermount3 -u "$M"
	[ -n "$DPID" ] && wait "$DPID"
	DPID=
}

# --- 1. the share not there ------------------------------------------------
mount_fg "$R" "$J" || { bad "first mount" "$(cat "$T/err")"; exit 1; }
"$FERRYFS" pause "$M" >/dev/null
printf 'pending bytes\n' >"$M/f"
sync "$M/f"
umount_fg # the journal keeps f pending
if [ -f "$R/.ferryfs/journal-"* ] 2>/dev/null || ls "$R/.ferryfs/" | grep -q '^journal-'; then
	ok "the first mount left its marker in .ferryfs/ on the share"
else
	bad "the first mount left its marker" "$(ls -la "$R" "$R/.ferryfs" 2>&1)"
fi
mv "$R" "$T/share.real"
mkdir "$R" # what a mount point shows while its file system is not mounted
if mount_fg "$R" "$J"; then
	umount_fg
	bad "a mount over a directory without the journal's marker is refused" \
		"it mounted; the empty directory now holds: $(ls -A "$R")"
else
	if grep -q 'refusing to mount' "$T/err" && grep -q -- '-o adopt' "$T/err" &&
		[ "$(grep -c . "$T/err")" = 1 ]; then
		ok "a mount over a directory without the journal's marker is refused in one line naming -o adopt"
	else
		bad "the refusal is one line naming -o adopt" "$(cat "$T/err")"
	fi
	[ -z "$(ls -A "$R")" ] && ok "nothing was put into the directory" ||
		bad "nothing was put into the directory" "$(ls -A "$R")"
fi
rmdir "$R" 2>/dev/null || rm -rf "$R"
mv "$T/share.real" "$R"
if mount_fg "$R" "$J" && "$FERRYFS" flush "$M" --wait >/dev/null 2>&1 &&
	[ "$(cat "$R/f" 2>/dev/null)" = "pending bytes" ]; then
	ok "with the share back, the pending file reaches it"
else
	bad "with the share back, the pending file reaches it" "$(cat "$T/err"; ls -la "$R")"
fi
is_mounted && umount_fg

mv "$R" "$T/share.real"
mkdir "$R" # another share at the same path
if mount_fg "$R" "$J" adopt && echo adopted >"$M/g" &&
	"$FERRYFS" flush "$M" --wait >/dev/null 2>&1 && umount_fg &&
	[ "$(cat "$R/g" 2>/dev/null)" = adopted ] &&
	ls "$R/.ferryfs/" | grep -q '^journal-' && mount_fg "$R" "$J"; then
	ok "-o adopt binds the journal to another share at its path on purpose"
else
	bad "-o adopt binds the journal to another share" "$(cat "$T/err")"
fi
is_mounted && umount_fg
rm -rf "$R"
mv "$T/share.real" "$R"
if mount_fg "$R" "$J"; then
	umount_fg
	bad "adopted elsewhere, the old share is refused" "it mounted"
else
	ok "adopted elsewhere, the journal refuses the old share"
fi
mount_fg "$R" "$J" adopt && umount_fg # back, for the tests below

# --- 2. two journals, one share ----------------------------------------------
J2=$T/journal2
if mount_fg "$R" "$J2" && echo two >"$M/two" &&
	"$FERRYFS" flush "$M" --wait >/dev/null 2>&1 && umount_fg &&
	[ "$(ls "$R/.ferryfs/" | grep -c '^journal-')" = 2 ] &&
	mount_fg "$R" "$J" && umount_fg && mount_fg "$R" "$J2" && umount_fg; then
	ok "two journals on one share: a marker each, both remount"
else
	bad "two journals on one share" "$(cat "$T/err"; ls -la "$R/.ferryfs")"
fi
is_mounted && umount_fg

# --- 3. hidden through the mount ------------------------------------------------
for mode in on off; do
	if ! mount_fg "$R" "$J" "writeback=$mode"; then
		bad "writeback=$mode: mount" "$(cat "$T/err")"
		continue
	fi
	out=$(ls -a "$M")
	if grep -qx .ferryfs <<<"$out"; then
		bad "writeback=$mode: .ferryfs is not listed" "$out"
	else
		ok "writeback=$mode: .ferryfs is not listed"
	fi
	if stat "$M/.ferryfs" >/dev/null 2>&1 || cat "$M/.ferryfs/journal-"* >/dev/null 2>&1; then
		bad "writeback=$mode: .ferryfs is not found" "$(stat "$M/.ferryfs" 2>&1)"
	else
		ok "writeback=$mode: .ferryfs is not found"
	fi
	if mkdir "$M/.ferryfs" 2>/dev/null || touch "$M/.ferryfs" 2>/dev/null ||
		mv "$M/f" "$M/.ferryfs" 2>/dev/null; then
		bad "writeback=$mode: .ferryfs cannot be made" "$(ls -la "$M")"
	else
		ok "writeback=$mode: .ferryfs cannot be made (mkdir, create, rename)"
	fi
	mkdir -p "$M/sub" && touch "$M/sub/.ferryfs" &&
		ok "writeback=$mode: .ferryfs below the root is an ordinary name" ||
		bad "writeback=$mode: .ferryfs below the root" "$(ls -la "$M/sub")"
	rm -rf "$M/sub"
	"$FERRYFS" flush "$M" --wait >/dev/null 2>&1
	umount_fg
done

# --- 4. a root that cannot be written ---------------------------------------
mkdir -p "$T/ro" "$T/ro2"
echo x >"$T/ro/x"
if chattr +i "$T/ro" 2>/dev/null; then
	J3=$T/journal3
	if mount_fg "$T/ro" "$J3" && grep -q "bound to the identity" "$T/err" &&
		[ "$(cat "$M/x")" = x ]; then
		ok "a root that cannot be written: bound to its identity, said once"
	else
		bad "a root that cannot be written" "$(cat "$T/err")"
	fi
	is_mounted && umount_fg
	chattr -i "$T/ro"
	mv "$T/ro" "$T/ro.real"
	mv "$T/ro2" "$T/ro" # another directory at the path
	chattr +i "$T/ro"
	if mount_fg "$T/ro" "$J3"; then
		umount_fg
		bad "that journal over another read-only directory is refused" "it mounted"
	else
		grep -q 'refusing to mount' "$T/err" &&
			ok "that journal over another read-only directory is refused" ||
			bad "that journal over another directory is refused with the reason" "$(cat "$T/err")"
	fi
	chattr -i "$T/ro"
	mv "$T/ro" "$T/ro2"
	mv "$T/ro.real" "$T/ro"
	chattr +i "$T/ro"
	mount_fg "$T/ro" "$J3" && ok "and over its own root it mounts again" ||
		bad "over its own root it mounts again" "$(cat "$T/err")"
	is_mounted && umount_fg
else
	bad "chattr +i works on $T (ext4 as root)" "$(chattr +i "$T/ro" 2>&1)"
fi

# --- 5. an emptied LMDB file ---------------------------------------------------
J4=$T/journal4
mount_fg "$R" "$J4" || bad "mount for the damage" "$(cat "$T/err")"
"$FERRYFS" pause "$M" >/dev/null
head -c 3000000 /dev/urandom >"$T/big"
cp "$T/big" "$M/big" && sync "$M/big"
kill -KILL "$DPID"
wait "$DPID" 2>/dev/null
DPID=
fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"
staged=$(du -sb "$J4/data" | cut -f1)
: >"$J4/meta.mdb/data.mdb"
if mount_fg "$R" "$J4"; then
	umount_fg
	bad "an emptied LMDB file is refused" "it mounted: $(cat "$T/err")"
else
	grep -q 'damaged' "$T/err" && [ "$(grep -c . "$T/err")" = 1 ] &&
		ok "an emptied LMDB file is refused in one line: $(cat "$T/err")" ||
		bad "an emptied LMDB file is refused with the reason" "$(cat "$T/err")"
fi
[ "$(du -sb "$J4/data" | cut -f1)" = "$staged" ] && [ "$staged" -ge 3000000 ] &&
	ok "its staging data is still there ($staged bytes)" ||
	bad "its staging data is still there" "$staged -> $(du -sb "$J4/data")"
[ -e "$R/big" ] && bad "nothing of it reached the share" "big is there" ||
	ok "nothing of it reached the share"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
