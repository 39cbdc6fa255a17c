#!/bin/bash
# pid lists are split on purpose; eval '...' strings expand when evaluated
# shellcheck disable=SC2016,SC2086
# it_cli.sh FERRYFS - the ferryfs command line and the ways to mount it.
#
# Registered directly with ctest (label "mount"); mounts by itself in a
# private temp dir. Checks:
#   --help, --version, no arguments, one argument;
#   bad remote (missing, a file), bad mountpoint (missing, a file), unknown
#   -o option: non-zero exit, exactly one line on stderr naming the culprit,
#   nothing mounted, no daemon left behind;
#   `ferryfs mount R M -f` in the background: fusermount3 -u ends it with 0,
#   and so does SIGTERM;
#   `ferryfs mount R M` daemonizes: returns 0 with the mount ready, the
#   daemon is detached from the caller's stdout/stderr; relative paths work;
#   `ferryfs R M -o opts` (the form mount.fuse3 runs);
#   mount(8) -t fuse.ferryfs with ferryfs on PATH; fstab (mount -T FILE);
#   mount.fuse3 with type#source and with -t; mount.fuse3(8)'s own options
#   setuid=USER and drop_privileges.
# Prints "ok N - name" / "not ok N - name: detail", then "N passed,
# M failed". Exit 1 on failure, 77 without root, /dev/fuse or fusermount3.
set -u

if [ $# -ne 1 ]; then
	echo "usage: it_cli.sh FERRYFS" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ]; then
	echo "# skip: needs root"
	exit 77
fi
if [ ! -c /dev/fuse ]; then
	echo "# skip: no /dev/fuse"
	exit 77
fi
for tool in fusermount3 mount.fuse3 setpriv timeout; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "# skip: no $tool"
		exit 77
	fi
done
FERRYFS=$(readlink -f "$1")
if [ ! -x "$FERRYFS" ]; then
	echo "it_cli: '$1' is not an executable" >&2
	exit 1
fi
SRCDIR=$(cd "$(dirname "$0")/../.." && pwd)

T=$(mktemp -d /tmp/ferryfs-cli.XXXXXX) || exit 1
chmod 0755 "$T"
mkdir "$T/bin"
ln -s "$FERRYFS" "$T/bin/ferryfs"
OUT=$T/cli.out
ERR=$T/cli.err

n=0
npass=0
nfail=0

ok() {
	n=$((n + 1))
	npass=$((npass + 1))
	echo "ok $n - $1"
}

notok() {
	n=$((n + 1))
	nfail=$((nfail + 1))
	echo "not ok $n - $1: $2"
}

skip() {
	n=$((n + 1))
	echo "ok $n - $1 # SKIP $2"
}

# check NAME DETAIL CMD...: ok if CMD succeeds
check() {
	local name=$1 detail=$2
	shift 2
	if "$@"; then
		ok "$name"
	else
		notok "$name" "$detail"
	fi
}

show() { tr '\n' '|' <"$1" | cut -c1-300; }

is_mounted() {
	awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo
}

fstype_of() {
	awk -v m="$1" '$5 == m {
		for (i = 7; $i != "-"; i++)
			;
		print $(i + 1)
	}' /proc/self/mountinfo | tail -n 1
}

wait_mounted() {
	local _
	for _ in $(seq 1 100); do
		is_mounted "$1" && return 0
		sleep 0.1
	done
	return 1
}

# pids of ferryfs processes that have $1 as one of their arguments
daemon_pids() {
	local p exe
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		[ "$exe" = "$FERRYFS" ] || continue
		tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -qxF -- "$1" &&
			echo "${p#/proc/}"
	done
}

# running PID: PID has not exited. A daemon's zombie is not (this VM's
# init reaps the orphans it adopts 1-2 s late: 2 s of each wait_gone)
running() {
	local s
	read -r s 2>/dev/null <"/proc/$1/stat" || return 1
	s=${s##*) }
	[ "${s%% *}" != Z ]
}

# wait_gone PID...: all gone within 10 s
wait_gone() {
	local _ p alive
	for _ in $(seq 1 100); do
		alive=0
		for p in "$@"; do
			running "$p" && alive=1
		done
		[ "$alive" = 0 ] && return 0
		sleep 0.1
	done
	return 1
}

unmount() {
	is_mounted "$1" || return 0
	timeout -s KILL 10 fusermount3 -u "$1" 2>/dev/null ||
		timeout -s KILL 10 umount "$1" 2>/dev/null ||
		umount -l "$1"
}

# the mounts here use the default journal and cache
# (/var/lib/ferryfs/{journal,cache}/ID): the ones this run made are removed
# at the end
JOURNALS=/var/lib/ferryfs/journal
CACHES=/var/lib/ferryfs/cache
journals_before=$(ls "$JOURNALS" 2>/dev/null)
caches_before=$(ls "$CACHES" 2>/dev/null)

cleanup() {
	local m p j
	cd /
	awk -v t="$T/" 'index($5, t) == 1 { print $5 }' /proc/self/mountinfo |
		while read -r m; do
			unmount "$m"
		done
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/exe" 2>/dev/null)" = "$FERRYFS" ] || continue
		tr '\0' '\n' <"$p/cmdline" | grep -qF -- "$T/" &&
			kill -KILL "${p#/proc/}" 2>/dev/null
	done
	for j in $(ls "$JOURNALS" 2>/dev/null); do
		grep -qxF "$j" <<<"$journals_before" || rm -rf "${JOURNALS:?}/$j"
	done
	for j in $(ls "$CACHES" 2>/dev/null); do
		grep -qxF "$j" <<<"$caches_before" || rm -rf "${CACHES:?}/$j"
	done
	if awk -v t="$T/" 'index($5, t) == 1 { f = 1 } END { exit !f }' \
		/proc/self/mountinfo; then
		echo "# $T still has mounts, left in place"
	else
		rm -rf "$T"
	fi
}
trap cleanup EXIT

k=0
# fresh R and M for each case, so that a daemon is found by its remote
new_pair() {
	k=$((k + 1))
	R=$T/remote$k
	M=$T/mnt$k
	mkdir -m 0755 "$R" "$M"
}

# run CMD...: stdin /dev/null, stdout to $OUT, stderr to $ERR, 30 s limit
run() {
	timeout -k 5 30 "$@" </dev/null >"$OUT" 2>"$ERR"
}

lines_of() { awk 'END { print NR }' "$1"; }

as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }

# ---- help, version, usage errors -------------------------------------------

run "$FERRYFS" --help
rc=$?
check "--help exits 0" "exit $rc" [ "$rc" = 0 ]
check "--help prints usage on stdout" "stdout: $(show "$OUT")" \
	grep -qi usage "$OUT"
check "--help mentions the mount command" "stdout: $(show "$OUT")" \
	grep -q mount "$OUT"

run "$FERRYFS" --version
rc=$?
check "--version exits 0" "exit $rc" [ "$rc" = 0 ]
version=$(sed -n 's/^project(ferryfs VERSION \([0-9.]*\).*/\1/p' \
	"$SRCDIR/CMakeLists.txt" 2>/dev/null)
if [ -n "$version" ]; then
	check "--version prints the project version $version" \
		"stdout: $(show "$OUT")" grep -qF "$version" "$OUT"
else
	check "--version prints a version" "stdout: $(show "$OUT")" \
		grep -qE '[0-9]+\.[0-9]+' "$OUT"
fi

run "$FERRYFS"
rc=$?
check "no arguments: non-zero exit" "exit $rc" [ "$rc" != 0 ]
check "no arguments: usage hint on stderr" "stderr: $(show "$ERR")" \
	grep -qiE 'usage|--help' "$ERR"

new_pair
run "$FERRYFS" "$R"
rc=$?
check "one argument only: non-zero exit" "exit $rc" [ "$rc" != 0 ]
unmount "$M"

# bad_mount NAME CULPRIT ARGS...: ferryfs ARGS must fail cleanly
bad_mount() {
	local name=$1 culprit=$2 rc nl pids
	shift 2
	run "$FERRYFS" "$@"
	rc=$?
	nl=$(lines_of "$ERR")
	check "$name: non-zero exit (no hang)" "exit $rc" \
		eval '[ "$rc" != 0 ] && [ "$rc" != 124 ]'
	check "$name: exactly one line on stderr" \
		"$nl lines: $(show "$ERR")" [ "$nl" = 1 ]
	check "$name: stderr names '$culprit'" "stderr: $(show "$ERR")" \
		grep -qF -- "$culprit" "$ERR"
	check "$name: nothing mounted" "$M is mounted" \
		eval '! is_mounted "$M"'
	pids=$(daemon_pids "$R")
	check "$name: no daemon left" "pids $pids" [ -z "$pids" ]
	unmount "$M"
	[ -z "$pids" ] || kill -KILL $pids 2>/dev/null
}

new_pair
bad_mount "missing remote" "$T/no-such-remote" \
	mount "$T/no-such-remote" "$M"
new_pair
echo file >"$T/a-file"
bad_mount "remote is a file" "$T/a-file" mount "$T/a-file" "$M"
new_pair
bad_mount "missing mountpoint" "$T/no-such-mnt" mount "$R" "$T/no-such-mnt"
new_pair
bad_mount "mountpoint is a file" "$T/a-file" mount "$R" "$T/a-file"
new_pair
bad_mount "unknown -o bogus_opt" "bogus_opt" mount "$R" "$M" -o bogus_opt

# ---- mount and unmount ------------------------------------------------------

# remote_has FILE TEXT: FILE holds TEXT within 10 s (write-back: the
# flusher takes it there in the background; a mount through /dev/fd has
# no control socket for a `ferryfs flush`)
remote_has() {
	local i
	for i in $(seq 1 100); do
		[ "$(cat "$1" 2>/dev/null)" = "$2" ] && return 0
		sleep 0.1
	done
	return 1
}

# round_trip NAME: a file written through $M lands in $R, and back
round_trip() {
	local name=$1 f=probe-$k
	if echo "written via $name" >"$M/$f" 2>"$T/rt.err" &&
		remote_has "$R/$f" "written via $name" &&
		echo "written on the remote" >"$R/$f.back" &&
		[ "$(cat "$M/$f.back" 2>/dev/null)" = "written on the remote" ]; then
		ok "$name: files go through to the remote and back"
	else
		notok "$name: files go through to the remote and back" \
			"$(show "$T/rt.err")"
	fi
}

# foreground, stopped by fusermount3 -u, then by SIGTERM, then by SIGTERM
# while files and a directory of the mount are open (their RELEASE never
# comes: the daemon must still close and free them, which the ASan pass
# checks through the exit status)
for stop in fusermount3 SIGTERM "SIGTERM, files open"; do
	new_pair
	"$FERRYFS" mount "$R" "$M" -f </dev/null >"$OUT" 2>"$ERR" &
	pid=$!
	if check "-f ($stop): mounted" "stderr: $(show "$ERR")" \
		wait_mounted "$M"; then
		check "-f ($stop): stays in the foreground" "pid $pid gone" \
			kill -0 "$pid"
		round_trip "-f ($stop)"
		case $stop in
		fusermount3) fusermount3 -u "$M" ;;
		SIGTERM) kill -TERM "$pid" ;;
		*)
			# read-through, a journal file read and written, a dir
			mkdir "$M/d$k" && echo local >"$M/w$k" &&
				exec 3<"$M/probe-$k.back" 4<"$M/w$k" \
					5>>"$M/w$k" 6<"$M/d$k"
			kill -TERM "$pid"
			;;
		esac
	fi
	check "-f ($stop): the process ends within 10 s" "still running" \
		wait_gone "$pid"
	kill -KILL "$pid" 2>/dev/null
	wait "$pid"
	rc=$?
	exec 3<&- 4<&- 5>&- 6<&-
	check "-f ($stop): exit status 0" "exit $rc, stderr: $(show "$ERR")" \
		[ "$rc" = 0 ]
	check "-f ($stop): unmounted afterwards" "$M still mounted" \
		eval '! is_mounted "$M"'
	unmount "$M"
done

# daemonized: returns once the mount is ready, detached from our stdio
new_pair
run "$FERRYFS" mount "$R" "$M"
rc=$?
check "daemonized mount: exit 0" "exit $rc, stderr: $(show "$ERR")" \
	[ "$rc" = 0 ]
check "daemonized mount: mounted when the command returns" \
	"$M not in mountinfo" is_mounted "$M"
wait_mounted "$M"
pids=$(daemon_pids "$R")
check "daemonized mount: one daemon process runs" "pids '$pids'" \
	[ "$(echo "$pids" | grep -c .)" = 1 ]
fds=
for p in $pids; do
	fds="$fds $(readlink "/proc/$p/fd/1") $(readlink "/proc/$p/fd/2")"
done
check "daemonized mount: the daemon let go of the caller's stdout/stderr" \
	"daemon fds 1,2:$fds" eval '! echo "$fds" | grep -qF -e "$OUT" -e "$ERR"'
check "daemonized mount: fstype fuse.ferryfs" "fstype '$(fstype_of "$M")'" \
	[ "$(fstype_of "$M")" = fuse.ferryfs ]
round_trip "daemonized mount"
fusermount3 -u "$M"
check "daemonized mount: fusermount3 -u ends the daemon" "pids $pids" \
	wait_gone $pids
unmount "$M"

# relative paths, daemonized (the daemon must not resolve them after cd /)
new_pair
(cd "$T" && run "$FERRYFS" mount "remote$k" "mnt$k")
rc=$?
check "relative paths: exit 0" "exit $rc, stderr: $(show "$ERR")" \
	[ "$rc" = 0 ]
if check "relative paths: mounted at the right place" "$M not mounted" \
	wait_mounted "$M"; then
	round_trip "relative paths"
fi
pids=$(daemon_pids "$R" ; daemon_pids "remote$k")
unmount "$M"
check "relative paths: unmount ends the daemon" "pids $pids" \
	wait_gone $pids

# mount_way NAME UNMOUNT CMD...: mount with CMD, use it, unmount with UNMOUNT
mount_way() {
	local name=$1 how=$2 rc pids
	shift 2
	run "$@"
	rc=$?
	check "$name: exit 0" "exit $rc, stderr: $(show "$ERR")" [ "$rc" = 0 ]
	if ! check "$name: mounted" "$M not mounted" wait_mounted "$M"; then
		return
	fi
	check "$name: fstype fuse.ferryfs" "fstype '$(fstype_of "$M")'" \
		[ "$(fstype_of "$M")" = fuse.ferryfs ]
	round_trip "$name"
	pids=$(daemon_pids "$R")
	check "$name: daemon found" "no ferryfs process has $R in argv" \
		[ -n "$pids" ]
	case $how in
	umount) umount "$M" ;;
	*) fusermount3 -u "$M" ;;
	esac
	check "$name: $how ends the daemon" "pids $pids" wait_gone $pids
	unmount "$M"
}

new_pair
mount_way "ferryfs REMOTE MNT -o allow_other" fusermount3 \
	"$FERRYFS" "$R" "$M" -o allow_other

# mount(8) runs its helper without PATH (mount.fuse3 then runs "ferryfs"
# through /bin/sh and its default PATH), so ferryfs on our PATH is not found.
# In a private mount namespace, $T/bin is bound over /usr/local/sbin, which
# is on that default PATH; the rest of the system sees nothing of it.
ns_cases() {
	if ! mount --bind "$T/bin" /usr/local/sbin; then
		notok "mount(8): bind ferryfs onto /usr/local/sbin" \
			"mount --bind failed"
		return
	fi
	new_pair
	mount_way "mount -t fuse.ferryfs (ferryfs on sh's default PATH)" \
		umount mount -t fuse.ferryfs "$R" "$M"
	new_pair
	printf '%s %s fuse.ferryfs noauto,_netdev,nofail,allow_other 0 0\n' \
		"$R" "$M" >"$T/fstab"
	mount_way "fstab entry (mount -T FILE MNT)" umount \
		mount -T "$T/fstab" "$M"
}

if unshare --mount --propagation private true 2>/dev/null; then
	export -f ok notok check show is_mounted fstype_of wait_mounted \
		daemon_pids wait_gone unmount new_pair run lines_of round_trip remote_has \
		mount_way ns_cases
	export FERRYFS T OUT ERR n npass nfail k
	unshare --mount --propagation private -- bash -c \
		'ns_cases; echo "$n $npass $nfail $k" >"$T/ns.state"'
	if read -r n npass nfail k <"$T/ns.state"; then
		:
	else
		notok "mount(8) cases in a private mount namespace" "no result"
	fi
else
	# what mount(8) would run: mount.fuse R M -o rw -t fuse.ferryfs
	echo "# no private mount namespace: running mount(8)'s helper directly"
	new_pair
	mount_way "mount.fuse REMOTE MNT -o rw -t fuse.ferryfs" fusermount3 \
		env PATH="$T/bin:$PATH" mount.fuse "$R" "$M" -o rw \
		-t fuse.ferryfs
fi

new_pair
mount_way "mount.fuse3 ferryfs#REMOTE MNT -o allow_other" fusermount3 \
	env PATH="$T/bin:$PATH" mount.fuse3 "ferryfs#$R" "$M" -o allow_other

new_pair
mount_way "mount.fuse3 REMOTE MNT -t ferryfs -o allow_other" fusermount3 \
	env PATH="$T/bin:$PATH" mount.fuse3 "$R" "$M" -t ferryfs \
	-o allow_other

# mount.fuse3(8): drop_privileges mounts first, then runs the daemon with
# /dev/fd/N as its mountpoint and no capabilities
new_pair
run env PATH="$T/bin:$PATH" mount.fuse3 "$R" "$M" -t ferryfs \
	-o drop_privileges,allow_other
rc=$?
check "mount.fuse3 -o drop_privileges: exit 0" \
	"exit $rc, stderr: $(show "$ERR")" [ "$rc" = 0 ]
if check "mount.fuse3 -o drop_privileges: mounted" "$M not mounted" \
	wait_mounted "$M"; then
	round_trip "mount.fuse3 -o drop_privileges"
	pids=$(daemon_pids "$R")
	caps=$(for p in $pids; do awk '/^CapEff/ { print $2 }' \
		"/proc/$p/status"; done)
	check "mount.fuse3 -o drop_privileges: the daemon has no capabilities" \
		"pids '$pids' CapEff '$caps'" \
		eval '[ -n "$pids" ] && ! echo "$caps" | grep -qv "^0*$"'
	fusermount3 -u "$M"
	check "mount.fuse3 -o drop_privileges: unmount ends the daemon" \
		"pids $pids" wait_gone $pids
fi
unmount "$M"

# mount.fuse3(8): setuid=USER runs the daemon as USER (here nobody, so
# the remote and the mountpoint are nobody's and only nobody may enter)
setuid_case() {
	local name="mount.fuse3 -o setuid=nobody" rc pids uids
	run env PATH="$T/bin:$PATH" mount.fuse3 "$R" "$M" -t ferryfs \
		-o setuid=nobody,nodev,nosuid
	rc=$?
	check "$name: exit 0" "exit $rc, stderr: $(show "$ERR")" [ "$rc" = 0 ]
	check "$name: mounted" "$M not mounted" wait_mounted "$M" || return
	pids=$(daemon_pids "$R")
	uids=$(for p in $pids; do
		awk '/^Uid/ { print $2 }' "/proc/$p/status"
	done)
	check "$name: the daemon runs as 65534" "pids '$pids' uids '$uids'" \
		eval '[ -n "$pids" ] && [ "$(echo "$uids" | sort -u)" = 65534 ]'
	if as_nobody sh -c 'echo by-nobody >"$1/probe"' sh "$M" \
		2>"$T/rt.err" &&
		[ "$(cat "$R/probe" 2>/dev/null)" = by-nobody ] &&
		[ "$(stat -c %u "$R/probe")" = 65534 ]; then
		ok "$name: nobody writes through it"
	else
		notok "$name: nobody writes through it" "$(show "$T/rt.err")"
	fi
	umount "$M"
	check "$name: umount ends the daemon" "pids $pids" wait_gone $pids
}

new_pair
chown 65534:65534 "$R" "$M"
if as_nobody test -r /dev/fuse -a -w /dev/fuse; then
	setuid_case
else
	skip "mount.fuse3 -o setuid=nobody" \
		"/dev/fuse is not usable by other users here"
fi
unmount "$M"

echo "$npass passed, $nfail failed"
[ "$nfail" = 0 ]
