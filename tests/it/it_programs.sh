#!/bin/bash
# it_programs.sh - real programs on a ferryfs mount.
#
# Run by tests/it/mount_run.sh, which exports MNT (the mount) and REMOTE
# (the backing directory). Each check prints "ok N - name" or
# "not ok N - name" followed by the tail of what the command printed; the
# last line is "N passed, M failed". Exit 1 if anything failed, 77 to skip.
#
# What it runs: cp -a of a tree with odd names, sizes, links, modes and old
# times; rsync -a twice (the second run must find nothing to do); tar x of
# 3000 files + 100 symlinks, then tar d; git init/add/commit/fsck/log/gc/
# clone; sqlite3 with the rollback journal and with WAL, one process and
# two at once. The results are compared through the mount and on REMOTE.
#
# IT_SKIP_FEATURES (comma-separated; tests/it/it_syscalls.c reads it too)
# names features the share lacks: xattr (the xattr checks print
# "ok N - name # SKIP <IT_SKIP_REASON>: why"), symlink_times (listings show
# '-' for a symlink's mtime and rsync runs with --omit-link-times), and for
# shares without POSIX semantics (smb): symlink (the trees have no
# symlinks), hardlink (no hard link), win_names (no name with a character
# Windows forbids), owner (no chown; listings show no owner, rsync keeps
# none), mode (listings show no mode, rsync keeps none), time_ns (times
# compared to the second).
set -euo pipefail

: "${MNT:?run through tests/it/mount_run.sh}"
: "${REMOTE:?run through tests/it/mount_run.sh}"

for tool in rsync tar git sqlite3 diff find getfattr setfattr; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "# skip: $tool is not installed"
		exit 77
	fi
done

W=$(mktemp -d /tmp/ferryfs-prog.XXXXXX)
trap 'rm -rf "$W"' EXIT
export LC_ALL=C.UTF-8
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=$W
umask 022

n=0
npass=0
nfail=0

feature_skipped() { [[ ",${IT_SKIP_FEATURES:-}," == *",$1,"* ]]; }
# skip_check NAME WHY: one skipped check
skip_check() {
	n=$((n + 1))
	echo "ok $n - $1 # SKIP ${IT_SKIP_REASON:-IT_SKIP_FEATURES}: $2"
}
link_mtime='%T@'
link_mtime_s='%Y'
if feature_skipped symlink_times; then
	link_mtime=-
	link_mtime_s=-
	rsync() { command rsync --omit-link-times "$@"; }
fi

# the listing fields of what the share keeps
f_mode='%m' f_owner='%U:%G' f_time='%T@'
s_mode='%a' s_time='%Y'
rsync_keep=()
if feature_skipped mode; then
	f_mode=- s_mode=-
	rsync_keep+=(--no-perms)
fi
if feature_skipped owner; then
	f_owner=-
	rsync_keep+=(--no-owner --no-group)
fi
if feature_skipped time_ns; then
	f_time='%Ts'
	rsync_keep+=(--modify-window=1)
fi
if [ ${#rsync_keep[@]} -gt 0 ]; then
	# after the first argument (-a), which would turn them back on
	rsync() { command rsync "$1" "${rsync_keep[@]}" "${@:2}"; }
	if feature_skipped symlink_times; then
		rsync() {
			command rsync "$1" --omit-link-times "${rsync_keep[@]}" "${@:2}"
		}
	fi
fi

# check NAME CMD [ARGS...]: runs CMD (a command or a function below) in a
# subshell with set -e, output to $W/out; prints ok / not ok and, on
# failure, the output's tail. (bash ignores set -e in a function called
# from an if condition; a background subshell that we wait for keeps it.)
# A check that looks at REMOTE first brings it up to date with the mount:
# IT_REMOTE_SYNC (mount_run.sh sets it for a write-back mount) flushes.
check() {
	local name=$1
	shift
	case "$name" in
	*REMOTE*)
		if [ -n "${IT_REMOTE_SYNC:-}" ] && ! eval "$IT_REMOTE_SYNC"; then
			echo "it_programs: '$IT_REMOTE_SYNC' failed" >&2
			exit 1
		fi
		;;
	esac
	n=$((n + 1))
	(
		set -e
		"$@"
	) >"$W/out" 2>&1 </dev/null &
	if wait $!; then
		npass=$((npass + 1))
		echo "ok $n - $name"
	else
		nfail=$((nfail + 1))
		echo "not ok $n - $name"
		tail -n 25 "$W/out" | sed 's/^/#   /'
	fi
}

# same_output CMD1 -- CMD2: both print the same (shows a diff otherwise)
same_output() {
	local a=() b=()
	while [ "$1" != -- ]; do
		a+=("$1")
		shift
	done
	shift
	b=("$@")
	"${a[@]}" >"$W/same.a" || return 1
	"${b[@]}" >"$W/same.b" || return 1
	diff -u "$W/same.a" "$W/same.b"
}

# listing DIR: one line per entry: path type size mode owner mtime (ns);
# no size for directories (it depends on the filesystem)
listing() {
	(
		cd "$1"
		find . ! -type d ! -type l -printf "%p %y %s $f_mode $f_owner $f_time\n"
		find . -type l -printf "%p %y %s $f_mode $f_owner $link_mtime\n"
		find . -type d -printf "%p %y - $f_mode $f_owner $f_time\n"
	) | sort
}

# listing_s DIR: the brief's 'stat -c %n %s %a %Y' form, dirs without size
listing_s() {
	(
		cd "$1"
		find . ! -type d ! -type l -print0 | sort -z |
			xargs -0 stat -c "%n %s $s_mode $s_time"
		find . -type l -print0 | sort -z |
			xargs -0 -r stat -c "%n %s $s_mode $link_mtime_s"
		find . -type d -print0 | sort -z | xargs -0 stat -c "%n - $s_mode $s_time"
	)
}

empty_file() { [ ! -s "$1" ] || { cat "$1"; return 1; }; }
equal() { [ "$1" = "$2" ] || { echo "got '$1', want '$2'"; return 1; }; }

# ---- cp -a ------------------------------------------------------------------

make_tree() {
	local s=$W/src
	mkdir -p "$s/a/b/c" "$s/emptydir" "$s/private"
	: >"$s/size0"
	head -c 1 /dev/urandom >"$s/size1"
	head -c 4095 /dev/urandom >"$s/size4095"
	head -c 4096 /dev/urandom >"$s/size4096"
	head -c 4097 /dev/urandom >"$s/size4097"
	head -c 65537 /dev/urandom >"$s/size65537"
	head -c $((1024 * 1024 + 3)) /dev/urandom >"$s/size1M+3"
	head -c $((20 * 1024 * 1024)) /dev/urandom >"$s/big20M"
	echo deep >"$s/a/b/c/deep.txt"
	echo small >"$s/small"
	if ! feature_skipped symlink; then
		ln -s small "$s/link-to-small"
		ln -s nowhere/at/all "$s/dangling"
		ln -s ../../small "$s/a/b/up-link"
	fi
	feature_skipped hardlink || ln "$s/small" "$s/hard-of-small"
	echo spaces >"$s/with some spaces"
	echo unicode >"$s/ünïcødé-файл-文件.txt"
	echo dash >"$s/-leading-dash"
	echo quote >"$s/quote'name"
	feature_skipped win_names || echo star >"$s/star*name"
	echo hidden >"$s/.hidden"
	echo secret >"$s/private/secret"
	echo exe >"$s/script.sh"
	echo ro >"$s/readonly"
	echo owned >"$s/owned-by-1000"
	echo xattr >"$s/with-xattr"
	chmod 0600 "$s/private/secret"
	chmod 0755 "$s/script.sh"
	chmod 0444 "$s/readonly"
	chmod 0700 "$s/private"
	feature_skipped owner || chown 1000:1000 "$s/owned-by-1000"
	setfattr -n user.comment -v hello "$s/with-xattr" 2>/dev/null || true
	# old times last: creating entries moves the directories' mtimes
	find "$s" -depth -exec touch -h -d '2001-02-03 04:05:06.123456789' {} +
	touch -d '1999-12-31 23:59:59' "$s/big20M"
}

cp_tree() { cp -a "$W/src" "$MNT/cp"; }
diff_tree() { diff -r --no-dereference "$W/src" "$1"; }
hardlink_kept() {
	local a b
	a=$(stat -c %i "$1/small")
	b=$(stat -c %i "$1/hard-of-small")
	equal "$b" "$a" && equal "$(stat -c %h "$1/small")" 2
}
xattr_kept() {
	equal "$(getfattr --only-values -n user.comment "$1/with-xattr")" hello
}

make_tree
check "cp -a a tree into the mount" cp_tree
check "cp -a: diff -r against the source" diff_tree "$MNT/cp"
check "cp -a: stat listing (name size mode mtime) equal on REMOTE" \
	same_output listing_s "$W/src" -- listing_s "$REMOTE/cp"
check "cp -a: full listing (type owner mtime ns) equal on REMOTE" \
	same_output listing "$W/src" -- listing "$REMOTE/cp"
check "cp -a: full listing equal through the mount" \
	same_output listing "$W/src" -- listing "$MNT/cp"
check "cp -a: REMOTE content equal (diff -r)" diff_tree "$REMOTE/cp"
if feature_skipped hardlink; then
	skip_check "cp -a: hard link kept" "no hard links"
else
	check "cp -a: hard link kept (mount)" hardlink_kept "$MNT/cp"
	check "cp -a: hard link kept (REMOTE)" hardlink_kept "$REMOTE/cp"
fi
if feature_skipped xattr; then
	skip_check "cp -a: user xattr kept" "no xattrs"
elif getfattr -n user.comment "$W/src/with-xattr" >/dev/null 2>&1; then
	check "cp -a: user xattr kept (mount)" xattr_kept "$MNT/cp"
	check "cp -a: user xattr kept (REMOTE)" xattr_kept "$REMOTE/cp"
fi

# ---- rsync ------------------------------------------------------------------

rsync_first() { rsync -a "$W/src/" "$MNT/r/"; }
rsync_itemize() {
	rsync -a --itemize-changes "$W/src/" "$MNT/r/" >"$W/rsync.i"
	empty_file "$W/rsync.i"
}
rsync_i() {
	rsync -a -i "$W/src/" "$MNT/r/" >"$W/rsync.i"
	empty_file "$W/rsync.i"
}
rsync_stats() {
	rsync -a --stats "$W/src/" "$MNT/r/" | tee "$W/rsync.s"
	grep -q '^Number of regular files transferred: 0$' "$W/rsync.s"
}
rsync_checksum() {
	rsync -a --checksum --dry-run -i "$W/src/" "$MNT/r/" >"$W/rsync.c"
	empty_file "$W/rsync.c"
}
rsync_one_change() {
	echo changed >>"$W/src/a/b/c/deep.txt"
	touch -d '2002-01-01' "$W/src/a/b/c/deep.txt" "$W/src/a/b/c"
	rsync -a -i "$W/src/" "$MNT/r/" >"$W/rsync.1"
	cat "$W/rsync.1"
	equal "$(grep -c . "$W/rsync.1")" 2 &&
		grep -q '^>f.* a/b/c/deep.txt$' "$W/rsync.1"
}

rsync_remote_itemize() {
	rsync -a --dry-run --itemize-changes "$W/src/" "$REMOTE/r/" >"$W/rsync.ri"
	empty_file "$W/rsync.ri"
}

check "rsync -a into the mount" rsync_first
check "rsync: diff -r against the source" diff_tree "$MNT/r"
check "rsync: listing equal on REMOTE" \
	same_output listing "$W/src" -- listing "$REMOTE/r"
check "rsync: diff -r on REMOTE against the source" diff_tree "$REMOTE/r"
# the flush left the application's times and modes on the share: rsync
# straight to REMOTE finds nothing to do (issue 3)
check "rsync -a --itemize-changes SRC/ REMOTE/r/: nothing to do" \
	rsync_remote_itemize
check "rsync again with --itemize-changes: nothing to do" rsync_itemize
check "rsync again with -i: nothing to do" rsync_i
check "rsync again with --stats: 0 files transferred" rsync_stats
check "rsync --checksum --dry-run: contents equal" rsync_checksum
check "rsync after one change: only that file (and its dir)" rsync_one_change
check "rsync after one change: diff -r" diff_tree "$MNT/r"

# ---- tar --------------------------------------------------------------------

make_tarball() {
	local t=$W/tsrc i d
	mkdir -p "$t"
	for d in $(seq -w 0 29); do
		mkdir "$t/dir$d"
	done
	# printf -v, not d=$(...): a fork each is 4 ms on the CI machine,
	# 12 s of every run for the 3000 files
	for i in $(seq 0 2999); do
		printf -v d '%02d' $((i % 30))
		printf 'file %d %*s\n' "$i" $((i % 1500)) x >"$t/dir$d/f$i"
	done
	for i in $(seq 0 99); do
		printf -v d '%02d' $((i % 30))
		feature_skipped symlink || ln -s "f$i" "$t/dir$d/link$i"
	done
	find "$t" -exec touch -h -d '2010-05-06 07:08:09' {} +
	tar -C "$t" -cf "$W/t.tar" .
}
tar_x() { mkdir "$MNT/tar" && tar -C "$MNT/tar" -xf "$W/t.tar"; }
tar_d() { tar -C "$MNT/tar" -df "$W/t.tar"; }
tar_d_remote() { tar -C "$REMOTE/tar" -df "$W/t.tar"; }
nlinks=100
feature_skipped symlink && nlinks=0
tar_counts() {
	equal "$(find "$1/tar" -type f | wc -l)" 3000 &&
		equal "$(find "$1/tar" -type l | wc -l)" $nlinks
}

make_tarball
check "tar x of 3000 files and $nlinks symlinks" tar_x
if feature_skipped mode || feature_skipped owner; then
	skip_check "tar d (compare)" "tar d compares modes and owners"
else
	check "tar d (compare) on the mount" tar_d
	check "tar d (compare) on REMOTE" tar_d_remote
fi
check "tar: 3000 files and $nlinks symlinks listed on the mount" \
	tar_counts "$MNT"
check "tar: 3000 files and $nlinks symlinks on REMOTE" tar_counts "$REMOTE"

# ---- git --------------------------------------------------------------------

G=(git -c user.name=ferryfs-it -c user.email=it@ferryfs.invalid
	-c init.defaultBranch=main -c safe.directory='*')
git_commit() {
	mkdir "$MNT/repo"
	cd "$MNT/repo"
	"${G[@]}" init -q
	cp -a "$W/src/a" "$W/src/small" "$W/src/size65537" .
	"${G[@]}" add -A
	"${G[@]}" commit -q -m first
	echo second >>small
	seq 1 5000 >numbers
	"${G[@]}" add -A
	"${G[@]}" commit -q -m second
}
git_fsck() { "${G[@]}" -C "$1" fsck --full --strict --no-progress; }
git_log() { equal "$("${G[@]}" -C "$MNT/repo" log --oneline | wc -l)" 2; }
git_status() {
	"${G[@]}" -C "$MNT/repo" status --porcelain >"$W/git.st"
	empty_file "$W/git.st"
}
git_gc() { "${G[@]}" -C "$MNT/repo" gc -q --aggressive --prune=now; }
git_clone() {
	"${G[@]}" clone -q "$MNT/repo" "$MNT/clone" &&
		equal "$("${G[@]}" -C "$MNT/clone" log --oneline | wc -l)" 2
}

check "git init, add, commit twice" git_commit
cd /
check "git fsck on the mount" git_fsck "$MNT/repo"
check "git log shows 2 commits" git_log
check "git status is clean" git_status
check "git gc --aggressive" git_gc
check "git fsck after gc" git_fsck "$MNT/repo"
check "git fsck of the REMOTE copy" git_fsck "$REMOTE/repo"
check "git clone within the mount" git_clone
check "git fsck of the clone" git_fsck "$MNT/clone"

# ---- sqlite3 ----------------------------------------------------------------

# sql_fill DB MODE: 10000 rows in one transaction, 200 in their own
sql_fill() {
	{
		echo "PRAGMA journal_mode=$2;"
		echo "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r BLOB);"
		echo "BEGIN;"
		echo "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1"
		echo "  FROM c WHERE i < 10000)"
		echo "INSERT INTO t(v, r) SELECT 'row' || i, randomblob(100) FROM c;"
		echo "COMMIT;"
		for i in $(seq 1 200); do
			echo "INSERT INTO t(v, r) VALUES('single$i', randomblob(50));"
		done
	} | sqlite3 -bail "$1"
}
sql_check() {
	equal "$(sqlite3 "$1" 'PRAGMA integrity_check;')" ok &&
		equal "$(sqlite3 "$1" 'SELECT count(*) FROM t;')" "$2"
}
sql_check_ro() {
	equal "$(sqlite3 -readonly "$1" 'PRAGMA integrity_check;')" ok &&
		equal "$(sqlite3 -readonly "$1" 'SELECT count(*) FROM t;')" "$2"
}
sql_mode() { equal "$(sqlite3 "$1" 'PRAGMA journal_mode;')" "$2"; }
# two processes insert 200 rows each at once, one transaction per row
sql_two_writers() {
	local pids=() w
	for w in a b; do
		{
			echo ".timeout 30000"
			for i in $(seq 1 200); do
				echo "INSERT INTO t(v) VALUES('$w$i');"
			done
		} | sqlite3 -bail "$1" >"$W/sql.$w" 2>&1 &
		pids+=($!)
	done
	wait "${pids[0]}" && wait "${pids[1]}" && cat "$W/sql.a" "$W/sql.b" &&
		empty_file "$W/sql.a" && empty_file "$W/sql.b"
}

check "mkdir for the databases" mkdir "$MNT/db"
check "sqlite3 rollback journal: create and insert 10200 rows" \
	sql_fill "$MNT/db/rollback.db" DELETE
check "sqlite3 rollback journal: integrity ok, 10200 rows" \
	sql_check "$MNT/db/rollback.db" 10200
check "sqlite3 rollback journal: two concurrent writers" \
	sql_two_writers "$MNT/db/rollback.db"
check "sqlite3 rollback journal: integrity ok, 10600 rows" \
	sql_check "$MNT/db/rollback.db" 10600
check "sqlite3 rollback journal: REMOTE copy read-only: ok, 10600 rows" \
	sql_check_ro "$REMOTE/db/rollback.db" 10600

check "sqlite3 WAL: create and insert 10200 rows" \
	sql_fill "$MNT/db/wal.db" WAL
check "sqlite3 WAL: journal_mode is wal" sql_mode "$MNT/db/wal.db" wal
check "sqlite3 WAL: integrity ok, 10200 rows" sql_check "$MNT/db/wal.db" 10200
check "sqlite3 WAL: two concurrent writers" sql_two_writers "$MNT/db/wal.db"
check "sqlite3 WAL: integrity ok, 10600 rows" sql_check "$MNT/db/wal.db" 10600
check "sqlite3 WAL: REMOTE copy read-only: ok, 10600 rows" \
	sql_check_ro "$REMOTE/db/wal.db" 10600

# ---- a file removed or replaced while open ---------------------------------

# A viewer has a file open (not read yet) that is on the share already
# (IT_REMOTE_SYNC: flushed) when it is removed, and another when a rename
# replaces it; after the share has caught up (flushed again), both still
# read whole, as POSIX keeps an unlinked open file.
open_removed() {
	mkdir "$MNT/ul"
	head -c 3000000 /dev/urandom >"$W/ul.src"
	cp "$W/ul.src" "$MNT/ul/gone"
	cp "$W/ul.src" "$MNT/ul/over"
	echo new >"$MNT/ul/new"
	if [ -n "${IT_REMOTE_SYNC:-}" ]; then eval "$IT_REMOTE_SYNC"; fi
	python3 - "$MNT/ul" "$W/ul.src" "${IT_REMOTE_SYNC:-true}" <<'EOF'
import os, subprocess, sys
d, src, sync = sys.argv[1:4]
want = open(src, "rb").read()
a = os.open(d + "/gone", os.O_RDONLY)
b = os.open(d + "/over", os.O_RDONLY)
os.unlink(d + "/gone")
os.rename(d + "/new", d + "/over")
subprocess.run(sync, shell=True, check=True)
for name, fd in (("removed", a), ("replaced", b)):
    got = os.pread(fd, len(want) + 1, 0)
    if got != want:
        sys.exit(f"{name}: read {len(got)} bytes, not the file's {len(want)}")
    os.close(fd)
EOF
	[ "$(cat "$MNT/ul/over")" = new ]
	rm -r "$MNT/ul"
}
check "a file open when removed or replaced: reads whole after the flush" \
	open_removed

# ---- removal ----------------------------------------------------------------

rm_all() {
	rm -rf "$MNT/cp" "$MNT/r" "$MNT/tar" "$MNT/clone" || return 1
	if [ -n "${IT_REMOTE_SYNC:-}" ]; then eval "$IT_REMOTE_SYNC" || return 1; fi
	for d in cp r tar clone; do
		if [ -e "$REMOTE/$d" ]; then
			echo "$REMOTE/$d still exists"
			return 1
		fi
	done
}
check "rm -rf of the trees removes them from REMOTE" rm_all

echo "$npass passed, $nfail failed"
[ "$nfail" = 0 ]
