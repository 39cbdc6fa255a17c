#!/bin/bash
# completion_check.sh FERRYFS - dist/ferryfs.bash-completion against the
# binary.
#
# Registered with ctest (labels "unit;pkg", < 1 s). Sources bash-completion
# and the file, then runs _ferryfs as readline would (COMP_WORDS,
# COMP_CWORD) with FERRYFS first on PATH, and checks:
#   - `ferryfs mount R M -o <TAB>` offers every -o option of `ferryfs
#     --help` (ours and libfuse's, as man_check.sh extracts them), and
#     nothing else; those that take a value end in '=';
#   - `ferryfs <TAB>` offers every command of the usage lines;
#   - after a comma, the last item: `-o streams=2,wri` -> writeback=;
#     `-o writeback=o` -> on, off; `flush --` -> --wait, `status --` ->
#     --json; `ferryfs -` the flags of --help.
# Prints "ok N - name" / "not ok N - name: detail", then "N passed,
# M failed". Exit 1 on failure, 77 without bash-completion.
set -u
# shellcheck source=tests/pkg/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ $# -ne 1 ]; then
	echo "usage: completion_check.sh FERRYFS" >&2
	exit 2
fi
FERRYFS=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BC=/usr/share/bash-completion/bash_completion
if [ ! -r "$BC" ]; then
	echo "# skip: no $BC (scripts/deps.sh --test installs bash-completion)"
	exit 77
fi
T=$(mktemp -d /tmp/ferryfs-compl.XXXXXX) || exit 1
trap 'rm -rf "$T"' EXIT
mkdir "$T/bin"
ln -s "$FERRYFS" "$T/bin/ferryfs"

# same WANT GOT: the two word lists as sets
same() { [ "$(tr -s ' ' '\n' <<<"$1" | sed '/^$/d' | sort -u)" = "$(tr -s ' ' '\n' <<<"$2" | sed '/^$/d' | sort -u)" ]; }

# complete WORD...: what _ferryfs offers for the last WORD
complete_words() {
	PATH=$T/bin:$PATH bash --norc --noprofile -c '
		. "$1"
		. "$2"
		compopt() { :; }
		shift 2
		COMP_WORDS=("$@")
		COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
		COMP_LINE="$*"
		COMP_POINT=${#COMP_LINE}
		COMPREPLY=()
		_ferryfs ferryfs
		printf "%s\n" "${COMPREPLY[@]}" | sort -u | tr "\n" " " | sed "s/ $//"
	' complete "$BC" "$SRC/dist/ferryfs.bash-completion" "$@"
}

"$FERRYFS" --help >"$T/help" 2>&1
# the -o options of --help, with '=' when the help shows a value
sed -nE 's/.*-o ([a-z_]+)(=?).*/\1\2/p' "$T/help" | sort -u >"$T/want.opts"
want=$(tr '\n' ' ' <"$T/want.opts" | sed 's/ $//')
got=$(complete_words ferryfs mount /r /m -o "")
if [ "$(wc -l <"$T/want.opts")" -lt 30 ]; then
	notok "options found in ferryfs --help" "$(wc -l <"$T/want.opts"): the extraction broke"
elif same "$want" "$got"; then
	ok "-o <TAB>: the $(wc -l <"$T/want.opts") -o options of --help"
else
	notok "-o <TAB>: the -o options of --help" \
		"missing: $(comm -23 "$T/want.opts" <(tr ' ' '\n' <<<"$got" | sort -u) | tr '\n' ' '); extra: $(comm -13 "$T/want.opts" <(tr ' ' '\n' <<<"$got" | sort -u) | tr '\n' ' ')"
fi
cmds=$(grep -E '^(usage:|  +) *ferryfs [a-z|]+' "$T/help" | grep -oE 'ferryfs [a-z|]+' |
	sed 's/^ferryfs //' | tr '|' '\n' | sort -u | tr '\n' ' ' | sed 's/ $//')
got=$(complete_words ferryfs "")
m=
for c in $cmds; do grep -qw -- "$c" <<<"$got" || m="$m $c"; done
[ -n "$cmds" ] && [ -z "$m" ] && ok "ferryfs <TAB>: the commands ($cmds)" ||
	notok "ferryfs <TAB>: the commands" "missing:$m; got '$got'"

t() { # t NAME WANT WORD...
	local name=$1 w=$2 g
	shift 2
	g=$(complete_words "$@")
	if same "$w" "$g"; then ok "$name"; else notok "$name" "want '$w', got '$g'"; fi
}
t "-o streams=2,wri<TAB>: the last item" "streams=2,writeback=" \
	ferryfs mount /r /m -o streams=2,wri
t "-o writeback=o<TAB>: on, off" "writeback=on writeback=off" \
	ferryfs mount /r /m -o writeback=o
t "-o sync=<TAB>: journal, remote" "sync=journal sync=remote" \
	ferryfs /r /m -o sync=
t "flush MNT --<TAB>: --wait" "--wait" ferryfs flush /m --
t "status --<TAB>: --json" "--json" ferryfs status --
flags=$(grep -oE -- '^ +-[a-zA-Z](, --[a-z-]+)?' "$T/help" | tr ',' '\n' |
	tr -d ' ' | sort -u | tr '\n' ' ')
t "ferryfs -<TAB>: the flags of --help" "$flags" ferryfs mount -

tally
