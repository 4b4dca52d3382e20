#!/usr/bin/env bash
# Runs a throwaway Redis for the registry/redis conformance suite.
#
#   scripts/engines/redis.sh start|stop|status
#
# start installs Debian's redis-server when missing, starts one instance on
# 127.0.0.1:${PARLEY_REDIS_PORT:-6390} that keeps nothing on disk, waits for
# PING, and records `export PARLEY_TEST_REDIS=...` in ${PARLEY_ENGINES_DIR}/env
# (also printed, so `eval "$(scripts/engines/redis.sh start | tail -n1)"` works).
# Every command is idempotent.
set -euo pipefail

dir="${PARLEY_ENGINES_DIR:-/tmp/parley-engines}"
port="${PARLEY_REDIS_PORT:-6390}"
data="$dir/redis"
pidfile="$data/redis.pid"
envfile="$dir/env"
addr="127.0.0.1:$port"

log() { echo "redis.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ping() { redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; }

running() { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

install() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return 0
	log "installing redis-server"
	export DEBIAN_FRONTEND=noninteractive
	# The package lists may be missing or stale on a fresh machine; refresh
	# them only when the first attempt fails, since an update is slow.
	if ! apt-get install -y -q redis-server >&2; then
		apt-get update -q >&2
		apt-get install -y -q redis-server >&2
	fi
}

setenv() { set_env "$envfile" PARLEY_TEST_REDIS "$addr"; }

start() {
	install
	mkdir -p "$data"
	if running && ping; then
		log "already running on $addr"
		setenv
		return 0
	fi
	if ping; then
		log "port $port answers PING but is not ours ($pidfile); refusing to reuse it"
		exit 1
	fi
	redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
		--dir "$data" --pidfile "$pidfile" --logfile "$data/redis.log"
	for _ in $(seq 1 100); do
		if ping; then
			log "ready on $addr"
			setenv
			return 0
		fi
		sleep 0.1
	done
	log "no PING answer on $addr after 10s; log follows"
	tail -n 20 "$data/redis.log" >&2 || true
	exit 1
}

stop() { stop_pidfile "$pidfile" 5; }

status() {
	if running && ping; then
		echo "redis: running on $addr (pid $(cat "$pidfile"))"
	else
		echo "redis: not running"
		return 1
	fi
}

run_action "$@"
