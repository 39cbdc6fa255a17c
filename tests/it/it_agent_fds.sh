#!/bin/bash
# it_agent_fds.sh FERRY_AGENT AGENT_PROBE - ferry-agent and its file
# descriptors (issue 38), on 127.0.0.1, no root needed:
#
# 1. started with a soft RLIMIT_NOFILE of 64 under a higher hard limit,
#    the agent raises the soft limit to the hard one (/proc/PID/limits);
# 2. started with 32 fds for good (soft = hard), 80 connections opened
#    and held idle: accept() meets EMFILE; the agent's CPU time (utime +
#    stime of /proc/PID/stat) over 3 s stays under 0.3 s (on 57bd6a8 it
#    spun at 100%: ~3 s), and once the connections are closed a real
#    client (agent_probe: handshake and a STAT) is served again.
#
# Exit 0 if every check passed, 1 if not, 77 without python3.
set -u

log() { printf 'it_agent_fds: %s\n' "$*"; }

if [ $# -ne 2 ]; then
	echo "usage: it_agent_fds.sh FERRY_AGENT AGENT_PROBE" >&2
	exit 2
fi
AGENT=$1
PROBE=$2
if ! command -v python3 >/dev/null; then
	log "skip: needs python3"
	exit 77
fi

W=$(mktemp -d /tmp/it_agent_fds.XXXXXX)
PID=
HOLDER=
fails=0
cleanup() {
	[ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null
	[ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT

check() { # check DESCRIPTION CMD...
	local what=$1
	shift
	if "$@"; then
		log "ok: $what"
	else
		log "FAIL: $what"
		fails=$((fails + 1))
	fi
}

mkdir "$W/root"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key"
chmod 600 "$W/key"

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_agent SOFT HARD: ferry-agent with those limits, $PID and $PORT
start_agent() {
	PORT=$(free_port)
	(ulimit -S -n "$1" && ulimit -H -n "$2" &&
		exec "$AGENT" --root "$W/root" --listen "127.0.0.1:$PORT" \
			--key-file "$W/key" --max-conns 500) \
		>"$W/agent.log" 2>&1 &
	PID=$!
	for _ in $(seq 100); do
		grep -q serving "$W/agent.log" && return 0
		sleep 0.05
	done
	log "error: ferry-agent does not start: $(cat "$W/agent.log")"
	exit 1
}

stop_agent() {
	kill "$PID" 2>/dev/null
	wait "$PID" 2>/dev/null
	PID=
}

cpu_ticks() { # utime + stime of $PID, in clock ticks
	awk '{ print $14 + $15 }' "/proc/$PID/stat"
}

# --- 1. the soft limit raised -----------------------------------------------
hard=$(ulimit -H -n)
if [ "$hard" = unlimited ] || [ "$hard" -gt 4096 ]; then
	hard=4096
fi
start_agent 64 "$hard"
soft_now=$(awk '/^Max open files/ { print $4 }' "/proc/$PID/limits")
check "1: soft RLIMIT_NOFILE raised from 64 to the hard $hard ($soft_now)" \
	test "$soft_now" = "$hard"
stop_agent

# --- 2. out of fds: no spin, and it recovers --------------------------------
start_agent 32 32
python3 - "$PORT" >"$W/holder.log" 2>&1 <<'EOF' &
import socket, sys, time
socks = []
for _ in range(80):
    s = socket.socket()
    s.connect(("127.0.0.1", int(sys.argv[1])))
    socks.append(s)
print("held", len(socks), flush=True)
time.sleep(30)
EOF
HOLDER=$!
for _ in $(seq 100); do
	grep -q held "$W/holder.log" && break
	sleep 0.05
done
sleep 1
t0=$(cpu_ticks)
sleep 3
t1=$(cpu_ticks)
hz=$(getconf CLK_TCK)
cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" 'BEGIN { printf "%.2f", d / hz }')
log "2: out of fds with 80 connections held: $cpu cpu-s in 3 s"
check "2: the agent does not spin on EMFILE ($cpu cpu-s in 3 s, < 0.3)" \
	awk -v c="$cpu" 'BEGIN { exit !(c < 0.3) }'
kill "$HOLDER" 2>/dev/null
wait "$HOLDER" 2>/dev/null
HOLDER=
ok=0
for _ in $(seq 20); do
	if out=$(timeout 10 "$PROBE" "127.0.0.1:$PORT" "$W/key" stat: 2>&1); then
		ok=1
		break
	fi
	sleep 0.25
done
check "2: served again once the connections closed ($out)" test $ok = 1
check "2: the agent still runs" kill -0 "$PID"
stop_agent

if [ $fails -ne 0 ]; then
	log "$fails check(s) failed; agent log:"
	tail -20 "$W/agent.log"
	exit 1
fi
log "all checks passed"
exit 0
