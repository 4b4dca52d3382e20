#!/usr/bin/env bash
# Runs a throwaway NATS server with JetStream for the bus/nats conformance suite.
#
#   scripts/engines/nats.sh start|stop|status
#
# start builds scripts/engines/natsserver (the nats-server Go module pinned in
# go.mod, so no prebuilt binary is fetched), runs it with
# `-js -p ${PARLEY_NATS_PORT:-4250} -sd DIR`, waits until the server greets
# clients with JetStream enabled, and records `export PARLEY_TEST_NATS=...` in
# ${PARLEY_ENGINES_DIR}/env (also printed). Every command is idempotent.
# A server restores every stream of its store before it serves JetStream, so
# a store holding many streams needs time: PARLEY_NATS_START_TIMEOUT seconds
# (default 120). A fresh store: stop, then rm -rf "$PARLEY_ENGINES_DIR/nats".
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${PARLEY_ENGINES_DIR:-/tmp/parley-engines}"
port="${PARLEY_NATS_PORT:-4250}"
data="$dir/nats"
bin="$dir/bin/natsserver"
pidfile="$data/nats.pid"
envfile="$dir/env"
url="nats://127.0.0.1:$port"
start_timeout="${PARLEY_NATS_START_TIMEOUT:-120}"

log() { echo "nats.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

running() { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

# ready reads the INFO line every NATS server sends on connect; JetStream is
# usable once it says so.
ready() {
	timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port && head -n1 <&3" 2>/dev/null |
		grep -q '"jetstream":true'
}

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; }

build() {
	export PATH="/usr/local/go/bin:$PATH"
	mkdir -p "$(dirname "$bin")"
	# go build is a no-op when nothing changed, and rebuilding on each start
	# keeps the server in step with the version pinned in go.mod.
	(cd "$root" && go build -o "$bin" ./scripts/engines/natsserver)
}

setenv() { set_env "$envfile" PARLEY_TEST_NATS "$url"; }

start() {
	mkdir -p "$data/store"
	if running && ready; then
		log "already running on $url"
		setenv
		return 0
	fi
	if answers; then
		log "port $port is taken by a process that is not ours ($pidfile)"
		exit 1
	fi
	build
	# setsid: the server must outlive this script and its caller's process group.
	setsid "$bin" -js -a 127.0.0.1 -p "$port" -sd "$data/store" -P "$pidfile" -l "$data/nats.log" \
		</dev/null >/dev/null 2>&1 &
	local pid=$! t0=$SECONDS
	until ready; do
		if ! kill -0 "$pid" 2>/dev/null; then
			log "the server exited during startup; log follows"
			tail -n 20 "$data/nats.log" >&2 || true
			exit 1
		fi
		if ((SECONDS - t0 > start_timeout)); then
			log "not ready on $url after ${start_timeout}s; log follows"
			tail -n 20 "$data/nats.log" >&2 || true
			exit 1
		fi
		sleep 0.1
	done
	log "ready on $url in $((SECONDS - t0))s ($("$bin" -v 2>&1))"
	setenv
}

stop() { stop_pidfile "$pidfile" 10; }

status() {
	if running && ready; then
		echo "nats: running on $url (pid $(cat "$pidfile"))"
	else
		echo "nats: not running"
		return 1
	fi
}

run_action "$@"
