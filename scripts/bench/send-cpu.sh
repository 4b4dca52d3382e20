#!/usr/bin/env bash
# send-cpu.sh SERVER_BINARY BENCH_BINARY [send flags...]
#
# Runs `parley-bench send` (BENCH_BINARY, a parley-bench) against a fresh embedded
# node started from SERVER_BINARY, and reports the server process's CPU
# time (user+system, from /proc/PID/stat) per ACKed message over the run.
# With PROFILE=FILE and a server that serves PARLEY_PPROF, a CPU profile
# of the server during the run is saved to FILE.
#
#   scripts/bench/send-cpu.sh ./parley-old ./parley-bench -pairs 16 -messages 500 -inflight 1
set -euo pipefail
server=$1 client=$2
shift 2
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The fair-sharing limits are lifted as `parley-bench` does (bench.Unthrottled),
# on builds that have them; older builds refuse the flags and start without.
unthrottled=(--gateway.user-send-rate 1e9 --gateway.user-send-burst 1000000000
	--gateway.conn-request-rate 1e9 --gateway.conn-request-burst 1000000000
	--gateway.max-sessions-per-user 1000000 --gateway.max-poll-sessions-per-user 1000000
	--gateway.user-handshake-rate 1e9 --gateway.user-handshake-burst 1000000000
	--gateway.source-accept-rate 0)
start() {
	PARLEY_PPROF=127.0.0.1:$pport "$server" serve --listen 127.0.0.1:$port --data-dir "$dir/data" "$@" 2>"$dir/server.log" &
	pid=$!
	for _ in $(seq 100); do
		if ! kill -0 "$pid" 2>/dev/null; then return 1; fi
		if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then return 0; fi
		sleep 0.1
	done
}
start "${unthrottled[@]}" || start
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
before=$(ticks)
if [[ -n "${PROFILE:-}" ]]; then
	curl -s -o "$PROFILE" "http://127.0.0.1:$pport/debug/pprof/profile?seconds=${PROFILE_SECONDS:-3}" &
	prof=$!
fi
"$client" send -addr 127.0.0.1:$port -data-dir "$dir/data" "$@" | tee "$dir/out"
after=$(ticks)
[[ -n "${PROFILE:-}" ]] && wait "$prof"
acked=$(awk '/ACKed/ {for (i=1;i<=NF;i++) if ($i ~ /^[0-9,]+$/) {gsub(",","",$i); print $i; exit}}' "$dir/out")
echo "server CPU: $(( (after - before) * 1000 / hz )) ms for ${acked:-?} messages: $(awk -v t=$((after-before)) -v hz=$hz -v n="${acked:-0}" 'BEGIN{ if (n>0) printf "%.1f", t*1e6/hz/n; else print "?"}') µs per message"
