#!/bin/bash
# demo.sh — ferryfs in two minutes, with no outside server:
#   ./examples/demo.sh        (as root; sudo ./examples/demo.sh from a user)
#
# Installs the build dependencies, builds ferryfs (reusing build/), makes a
# local directory play the NAS (/var/tmp/ferryfs-demo/nas), mounts ferryfs
# over it (write-back: the journal in /var/tmp/ferryfs-demo/journal), copies
# a ~200 MB sample tree (a few big files, ~2,000 small ones, a symlink, a
# hard link) into the mount with `cp -a`, which returns at local-disk speed,
# shows the flush draining it to the NAS (`ferryfs status`, `ferryfs flush
# --wait`), and checks by SHA-256 that the NAS holds exactly the source.
# Always unmounts and removes the demo directory at the end (--keep leaves
# it).
#
# Environment: BUILD_DIR=build  DEMO_DIR=/var/tmp/ferryfs-demo
#              DEMO_OPTS="-o ..."  (extra ferryfs mount options)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
DEMO_DIR=${DEMO_DIR:-/var/tmp/ferryfs-demo}
KEEP=0
case "${1:-}" in
--keep) KEEP=1 ;;
"") ;;
-h | --help)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
*)
	echo "demo.sh: unknown option '$1' (try --help)" >&2
	exit 2
	;;
esac

SRC=$DEMO_DIR/source
NAS=$DEMO_DIR/nas
MNT=$DEMO_DIR/mnt
LOG=$DEMO_DIR/ferryfs.log
JOURNAL=$DEMO_DIR/journal
t_start=$(date +%s.%N)

step() { printf '\n==> %s\n' "$*"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
mbps() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f", (s > 0 ? n / s / 1e6 : 0) }'; }

unmount() {
	mountpoint -q "$1" 2>/dev/null || return 0
	for _ in 1 2 3 4 5; do
		fusermount3 -u "$1" 2>/dev/null && return 0
		sleep 0.5
	done
	echo "demo: '$1' busy; detaching it lazily" >&2
	fusermount3 -uz "$1" || umount -l "$1"
}

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local rc=$?
	unmount "$MNT" || true
	if ((KEEP)); then
		echo "demo: kept $DEMO_DIR"
	else
		rm -rf "$DEMO_DIR"
	fi
	if ((rc != 0)); then
		echo "demo: FAILED (exit $rc)" >&2
		[[ -s "$LOG" ]] && { echo "--- ferryfs log:"; tail -n 20 "$LOG"; } >&2
	fi
	return 0
}

# --- dependencies and build ------------------------------------------------
step "dependencies"
"$ROOT/scripts/deps.sh"

step "build ($BUILD_DIR)"
build_log=$(mktemp /tmp/ferryfs-demo-build.XXXXXX)
if { [[ -f "$BUILD_DIR/CMakeCache.txt" ]] ||
	cmake -S "$ROOT" -B "$BUILD_DIR" -DFERRYFS_WERROR=ON; } >"$build_log" 2>&1 &&
	cmake --build "$BUILD_DIR" --target ferryfs -j"$(nproc)" >>"$build_log" 2>&1; then
	rm -f "$build_log"
else
	tail -n 40 "$build_log" >&2
	echo "demo: build failed (full log: $build_log)" >&2
	exit 1
fi
FERRYFS=$(realpath "$BUILD_DIR/fs/ferryfs")
echo "$("$FERRYFS" --version 2>&1 | head -n 1)  ($FERRYFS)"

# --- the NAS and the sample tree --------------------------------------------
if [[ -e "$DEMO_DIR" ]]; then
	unmount "$MNT"
	rm -rf "$DEMO_DIR"
fi
trap cleanup EXIT
mkdir -p "$SRC" "$NAS" "$MNT"

step "making a ~200 MB sample tree in $SRC"
mkdir -p "$SRC/video" "$SRC/photos" "$SRC/docs" "$SRC/empty"
head -c 64M /dev/urandom >"$SRC/video/take-01.mov"
head -c 48M /dev/urandom >"$SRC/video/take-02.mov"
head -c 32M /dev/urandom >"$SRC/video/audio.wav"
# ~2,000 small files of 1-48 KiB in 40 folders
perl -e '
	srand(2024);
	open(my $r, "<", "/dev/urandom") or die "urandom: $!";
	for my $d (1 .. 40) {
		my $dir = sprintf("%s/photos/%03d", $ARGV[0], $d);
		mkdir $dir or die "$dir: $!";
		for my $f (1 .. 50) {
			my $len = 1024 + int(rand(47 * 1024));
			read($r, my $buf, $len) == $len or die "short read";
			open(my $o, ">", sprintf("%s/img_%04d.jpg", $dir, $f)) or die;
			print $o $buf;
			close($o) or die;
		}
	}' "$SRC"
cp -a /usr/share/common-licenses "$SRC/docs/" 2>/dev/null || true
echo "ferryfs demo — $(date -u +%FT%TZ)" >"$SRC/README.txt"
chmod 0640 "$SRC/README.txt"
touch -d '2001-02-03 04:05:06' "$SRC/README.txt"
ln -s video/take-02.mov "$SRC/latest.mov"
ln "$SRC/video/audio.wav" "$SRC/docs/audio-hardlink.wav"
src_bytes=$(du -sb "$SRC" | cut -f1)
src_files=$(find "$SRC" -type f | wc -l)
printf '%s files, %s MB\n' "$src_files" "$((src_bytes / 1000000))"

# --- mount --------------------------------------------------------------------
step "ferryfs mount $NAS $MNT"
# shellcheck disable=SC2086 # DEMO_OPTS is a list of options
"$FERRYFS" mount "$NAS" "$MNT" -o journal="$JOURNAL",cache="$DEMO_DIR/cache" ${DEMO_OPTS:-} >"$LOG" 2>&1
for _ in $(seq 50); do
	mountpoint -q "$MNT" && break
	sleep 0.1
done
mountpoint -q "$MNT" || { echo "demo: '$MNT' is not mounted" >&2; exit 1; }
findmnt -n -o SOURCE,TARGET,FSTYPE,OPTIONS "$MNT"

# --- copy ---------------------------------------------------------------------
step "cp -a $SRC/. $MNT/"
t0=$(date +%s.%N)
cp -a "$SRC/." "$MNT/"
t_cp=$(elapsed "$t0")
echo "cp -a returned after ${t_cp}s ($(mbps "$src_bytes" "$t_cp") MB/s): the data is in the journal, the flush is under way"
echo "state of video/take-01.mov: $(getfattr --absolute-names --only-values -n user.ferryfs.state "$MNT/video/take-01.mov")"

step "ferryfs status $MNT"
"$FERRYFS" status "$MNT"

step "ferryfs flush $MNT --wait"
"$FERRYFS" flush "$MNT" --wait
t_nas=$(elapsed "$t0")
echo "on the NAS ${t_nas}s after cp started ($(mbps "$src_bytes" "$t_nas") MB/s)"
echo "state of video/take-01.mov: $(getfattr --absolute-names --only-values -n user.ferryfs.state "$MNT/video/take-01.mov")"

# --- look at it ---------------------------------------------------------------
step "ls -l $MNT"
ls -l "$MNT"
step "df -h $MNT $NAS"
df -h "$MNT" "$NAS"
step "stat $MNT/README.txt"
stat "$MNT/README.txt"
step "hard link and symlink through the mount"
stat -c '%n: %s bytes, %h links, inode %i' "$MNT/video/audio.wav" "$MNT/docs/audio-hardlink.wav"
stat -c "%N" "$MNT/latest.mov"

# --- verify -------------------------------------------------------------------
step "sha256 of every file: source vs NAS (direct) vs mount"
# (.ferryfs/ at the NAS root: the journal's marker, hidden in the mount)
sums() { (cd "$1" && find . -path ./.ferryfs -prune -o -type f -print0 | sort -z | xargs -0 sha256sum); }
sums "$SRC" >"$DEMO_DIR/src.sha256"
sums "$NAS" >"$DEMO_DIR/nas.sha256"
t0=$(date +%s.%N)
sums "$MNT" >"$DEMO_DIR/mnt.sha256"
t_read=$(elapsed "$t0")
ok=1
for side in nas mnt; do
	if ! cmp -s "$DEMO_DIR/src.sha256" "$DEMO_DIR/$side.sha256"; then
		ok=0
		echo "MISMATCH source vs $side:"
		diff "$DEMO_DIR/src.sha256" "$DEMO_DIR/$side.sha256" | head -n 10
	fi
done
# metadata that cp -a must carry: mode, mtime, symlink target
for f in README.txt latest.mov; do
	a=$(stat -c '%A %Y %N' "$SRC/$f" | sed "s|$SRC/||")
	b=$(stat -c '%A %Y %N' "$NAS/$f" | sed "s|$NAS/||")
	[[ "$a" == "$b" ]] || { ok=0; echo "MISMATCH $f: source '$a' vs NAS '$b'"; }
done
((ok)) || { echo "demo: the NAS does not hold what was copied" >&2; exit 1; }
echo "OK: $src_files files identical (read back through the mount in ${t_read}s)"

# --- unmount -------------------------------------------------------------------
step "fusermount3 -u $MNT"
unmount "$MNT"
echo "unmounted; the NAS keeps the files: $(find "$NAS" -type f | wc -l) files, $(du -sh "$NAS" | cut -f1)"

step "done in $(elapsed "$t_start")s"
