#!/bin/bash
# man_check.sh FERRYFS FERRY_AGENT - the man pages against the binaries.
#
# Registered with ctest (labels "unit;pkg"). Checks, for man/ferryfs.8 and
# man/ferry-agent.8:
#   - mandoc -Tlint -W warning: no warning or error;
#   - man --warnings (groff): renders with nothing on stderr;
#   - every option the binary accepts is documented in the page's OPTIONS
#     section: the -o options and flags of `ferryfs --help` (ours and
#     libfuse's), those of fs/opts.c's opt_spec (what the parser really
#     takes, listed in --help or not), the commands of the usage lines and
#     their flags; for ferry-agent the long options of its usage line and
#     of agent/main.c's getopt table;
#   - nothing is documented as an option that the binary does not take
#     (libfuse's mount options that --help does not list are named below).
# Prints "ok N - name" / "not ok N - name: detail", then "N passed,
# M failed". Exit 1 on failure, 77 without mandoc or man.
set -u
# shellcheck source=tests/pkg/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ $# -ne 2 ]; then
	echo "usage: man_check.sh FERRYFS FERRY_AGENT" >&2
	exit 2
fi
FERRYFS=$1
AGENT=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
for tool in mandoc man; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "# skip: no $tool (scripts/deps.sh --test installs it)"
		exit 77
	fi
done
# libfuse's mount options the page documents that `ferryfs --help` does
# not list (fuse_session_new() and mount(2) take them)
LIBFUSE_MOUNT_OPTS="ro nosuid nodev noexec noatime fsname"


T=$(mktemp -d /tmp/ferryfs-man.XXXXXX) || exit 1
trap 'rm -rf "$T"' EXIT

# --- the pages render cleanly ---------------------------------------------
for page in "$SRC"/man/ferryfs.8 "$SRC"/man/ferry-agent.8; do
	name=$(basename "$page")
	if mandoc -Tlint -W warning "$page" >"$T/lint" 2>&1 && [ ! -s "$T/lint" ]; then
		ok "mandoc -Tlint $name"
	else
		notok "mandoc -Tlint $name" "$(tr '\n' '|' <"$T/lint")"
	fi
	if MANWIDTH=80 man --warnings -E UTF-8 -l "$page" >"$T/out" 2>"$T/err" &&
		[ ! -s "$T/err" ] && [ -s "$T/out" ]; then
		ok "man --warnings $name"
	else
		notok "man --warnings $name" "$(tr '\n' '|' <"$T/err")"
	fi
done

# --- what a page documents --------------------------------------------------
# man_opts PAGE: the "-o" option names (.It Cm NAME ...) and the flags
# (.It Fl X, .It Fl \-word) of the OPTIONS section, one a line
man_opts() {
	awk '
	/^\.Sh / { on = ($2 == "OPTIONS") ; next }
	!on || !/^\.It / { next }
	/^\.It Cm / {
		s = substr($0, 8)
		sub(/ (Ns|Ar|Op) .*/, "", s)
		n = split(s, a, / , /)
		for (i = 1; i <= n; i++) print a[i]
		next
	}
	{
		for (i = 2; i <= NF; i++)
			if ($(i - 1) == "Fl") {
				f = $i
				gsub(/\\-/, "-", f)
				print "-" f
			}
	}' "$1" | sort -u
}
# man_cmds PAGE: the commands of the COMMANDS section (.It Cm NAME)
man_cmds() {
	awk '/^\.Sh / { on = ($2 == "COMMANDS"); next }
	on && /^\.It Cm / { print $3 }' "$1" | sort -u
}

# --- what ferryfs takes -------------------------------------------------------
"$FERRYFS" --help >"$T/help" 2>&1 || {
	notok "ferryfs --help" "exit $?"
}
# ours: before "FUSE options:"; libfuse's: after it
sed '/^FUSE options:/,$d' "$T/help" >"$T/help.ours"
sed -n '/^FUSE options:/,$p' "$T/help" >"$T/help.fuse"
{
	grep -oE -- '-o [a-z_]+' "$T/help.ours" | sed 's/^-o //'
	grep -oE -- '^ +-[a-zA-Z](, --[a-z-]+)?' "$T/help.ours" |
		tr ',' '\n' | tr -d ' '
} | sort -u >"$T/help.opts"
grep -oE -- '-o [a-z_]+' "$T/help.fuse" | sed 's/^-o //' | sort -u >"$T/help.fuseopts"
# the parser's table: FUSE_OPT_KEY("x"), OPT("x"), OPTV("x=%s")
awk '/opt_spec\[\] = \{/ { on = 1; next } on && /FUSE_OPT_END/ { exit }
	on' "$SRC/fs/opts.c" | grep -oE '\("[^"]+"' | sed 's/^("//; s/"$//; s/=.*//' |
	sort -u >"$T/src.opts"
# the usage lines' commands and their flags
grep -E '^(usage:|  +) *ferryfs [a-z|]+' "$T/help" | grep -oE 'ferryfs [a-z|]+' |
	sed 's/^ferryfs //' | tr '|' '\n' | sort -u >"$T/help.cmds"
grep -E 'ferryfs [a-z|]+' "$T/help" | grep -oE -- '--[a-z]+' | sort -u >"$T/help.cmdflags"

man_opts "$SRC/man/ferryfs.8" >"$T/man.opts"
man_cmds "$SRC/man/ferryfs.8" >"$T/man.cmds"

if [ "$(wc -l <"$T/help.opts")" -lt 30 ] || [ "$(wc -l <"$T/src.opts")" -lt 30 ]; then
	notok "ferryfs: options found in --help and fs/opts.c" \
		"$(wc -l <"$T/help.opts") and $(wc -l <"$T/src.opts"): the extraction broke"
else
	ok "ferryfs: $(wc -l <"$T/help.opts") options in --help, $(wc -l <"$T/src.opts") in fs/opts.c"
fi

# missing LIST DOCUMENTED: the lines of LIST not in DOCUMENTED
missing() { comm -23 "$1" "$2" | tr '\n' ' ' | sed 's/ $//'; }
# none_missing NAME WHAT LIST DOCUMENTED: ok NAME when every line of LIST
# is in DOCUMENTED, else not ok with WHAT: the lines that are not
none_missing() {
	m=$(missing "$3" "$4")
	if [ -z "$m" ]; then ok "$1"; else notok "$1" "$2: $m"; fi
}

none_missing "ferryfs.8 documents every option of ferryfs --help" missing \
	"$T/help.opts" "$T/man.opts"
none_missing "ferryfs.8 documents every option of fs/opts.c" missing \
	"$T/src.opts" "$T/man.opts"
none_missing "ferryfs.8 documents libfuse's options of --help" missing \
	"$T/help.fuseopts" "$T/man.opts"
none_missing "ferryfs.8 documents every command" missing \
	"$T/help.cmds" "$T/man.cmds"
m=
for f in $(cat "$T/help.cmdflags"); do
	grep -qF "Fl \\${f#-}" "$SRC/man/ferryfs.8" || m="$m $f"
done
[ -z "$m" ] && ok "ferryfs.8 documents the commands' flags" ||
	notok "ferryfs.8 documents the commands' flags" "missing:$m"
printf '%s\n' $LIBFUSE_MOUNT_OPTS | cat - "$T/help.opts" "$T/src.opts" \
	"$T/help.fuseopts" | sort -u >"$T/known"
none_missing "ferryfs.8 documents no option ferryfs does not take" unknown \
	"$T/man.opts" "$T/known"

# --- what ferry-agent takes ---------------------------------------------------
"$AGENT" --help >"$T/ahelp" 2>&1 || notok "ferry-agent --help" "exit $?"
grep -oE -- '--[a-z-]+' "$T/ahelp" | sort -u >"$T/ahelp.opts"
awk '/struct option lo\[\] = \{/ { on = 1; next } on && /\};/ { exit } on' \
	"$SRC/agent/main.c" | grep -oE '\{ "[a-z-]+"' | sed 's/^{ "/--/; s/"$//' |
	sort -u >"$T/asrc.opts"
man_opts "$SRC/man/ferry-agent.8" >"$T/aman.opts"
if [ "$(wc -l <"$T/ahelp.opts")" -lt 5 ] || [ "$(wc -l <"$T/asrc.opts")" -lt 5 ]; then
	notok "ferry-agent: options found in --help and agent/main.c" "the extraction broke"
else
	ok "ferry-agent: $(wc -l <"$T/ahelp.opts") options in --help, $(wc -l <"$T/asrc.opts") in agent/main.c"
fi
none_missing "ferry-agent.8 documents every option of --help" missing \
	"$T/ahelp.opts" "$T/aman.opts"
none_missing "ferry-agent.8 documents every option of agent/main.c" missing \
	"$T/asrc.opts" "$T/aman.opts"
sort -u "$T/ahelp.opts" "$T/asrc.opts" >"$T/aknown"
none_missing "ferry-agent.8 documents no option ferry-agent does not take" \
	unknown "$T/aman.opts" "$T/aknown"

tally
