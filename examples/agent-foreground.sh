#!/bin/bash
# agent-foreground.sh - ferry-agent in the foreground, for a try or a
# supervisor other than systemd (dist/ferry-agent@.service):
#
#   examples/agent-foreground.sh DIR [ADDR:PORT] [KEY_FILE]
#
# Serves DIR (the directory the share exports) on ADDR:PORT (default
# 0.0.0.0:7077) with the key in KEY_FILE (default DIR/../ferry-agent.key,
# made with 32 random bytes, mode 0600, if missing), prints the mount
# option to use on the client and runs until Ctrl-C. Builds ferry-agent
# into build/ if it is not there.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:?usage: $0 DIR [ADDR:PORT] [KEY_FILE]}
listen=${2:-0.0.0.0:7077}
key=${3:-$(dirname "$(realpath "$dir")")/ferry-agent.key}
agent=${FERRY_AGENT:-$ROOT/build/agent/ferry-agent}
if [[ ! -x $agent ]]; then
	cmake -S "$ROOT" -B "$ROOT/build" >/dev/null
	cmake --build "$ROOT/build" --target ferry-agent -j"$(nproc)" >/dev/null
fi
if [[ ! -f $key ]]; then
	(umask 077 && head -c 32 /dev/urandom | base64 >"$key")
	echo "made a key: $key (copy it to the client, mode 0600)"
fi
echo "on the client: ferryfs mount SHARE MNT -o agent=${listen/0.0.0.0/THIS_HOST},agent_key=KEY_FILE"
exec "$agent" --root "$dir" --listen "$listen" --key-file "$key"
