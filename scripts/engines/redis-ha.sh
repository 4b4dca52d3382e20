#!/usr/bin/env bash
# Runs a Redis with Sentinel on loopback for the failover tests: a primary,
# one replica and three Sentinels (Debian's redis-sentinel) monitoring them
# as master "parley". internal/clustertest's TestRedisFailoverMidStorm runs
# a topology of its own through this script (its own directory and ports).
#
#   scripts/engines/redis-ha.sh start|stop|status
#
# Ports: the primary ${PARLEY_REDIS_HA_PORT:-6480}, the replica the next
# one, the Sentinels ${PARLEY_REDIS_SENTINEL_PORT:-26480} and the two
# next. Nothing is kept on disk but the Sentinels' own files. The
# Sentinels call a primary down after 1 s without an answer
# (down-after-milliseconds 1000) and need 2 of 3 to agree, so a failover
# takes about 2–4 s. start records
#   export PARLEY_TEST_REDIS_SENTINELS=127.0.0.1:26480,127.0.0.1:26481,127.0.0.1:26482
#   export PARLEY_TEST_REDIS_MASTER=parley
# in ${PARLEY_ENGINES_DIR}/env (also printed). start is idempotent and also
# brings back an instance a test killed (a returning old primary becomes a
# replica: the Sentinels reconfigure it).
set -euo pipefail

dir="${PARLEY_ENGINES_DIR:-/tmp/parley-engines}"
port="${PARLEY_REDIS_HA_PORT:-6480}"
sport="${PARLEY_REDIS_SENTINEL_PORT:-26480}"
data="$dir/redis-ha"
envfile="$dir/env"
master=parley

log() { echo "redis-ha.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ping() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
# running: used by stop_pidfile with $pidfile set.
running() { alive "$pidfile"; }

install() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v redis-sentinel >/dev/null && return 0
	log "installing redis-server and redis-sentinel"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -q redis-server redis-sentinel >&2; then
		apt-get update -q >&2
		apt-get install -y -q redis-server redis-sentinel >&2
	fi
	# The packages' own services (a system Redis on 6379, a Sentinel on
	# 26379) are not these; where an init system started them, stop them.
	service redis-sentinel stop >/dev/null 2>&1 || true
}

# primary_port prints the port the Sentinels name as the primary (the
# configured primary before any failover).
primary_port() {
	local p
	for i in 0 1 2; do
		p=$(redis-cli -h 127.0.0.1 -p $((sport + i)) sentinel get-master-addr-by-name "$master" 2>/dev/null | sed -n 2p)
		[[ -n "$p" ]] && { echo "$p"; return; }
	done
	echo "$port"
}

start_redis() { # N (0 primary, 1 replica)
	local n=$1 p=$((port + $1)) d="$data/r$1"
	mkdir -p "$d"
	alive "$d/redis.pid" && ping "$p" && return 0
	local role=()
	if ((n == 1)); then
		role=(--replicaof 127.0.0.1 "$port")
	fi
	if [[ -f "$data/started" ]]; then
		# Coming back after a kill: join whatever the Sentinels call the
		# primary now (they would reconfigure it anyway).
		local pp
		pp=$(primary_port)
		if [[ "$pp" != "$p" ]]; then role=(--replicaof 127.0.0.1 "$pp"); else role=(); fi
	fi
	redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" --appendonly no \
		--dir "$d" --pidfile "$d/redis.pid" --logfile "$d/redis.log" "${role[@]}"
	for _ in $(seq 1 100); do ping "$p" && return 0; sleep 0.1; done
	log "redis on $p did not answer; log follows"
	tail -n 20 "$d/redis.log" >&2 || true
	exit 1
}

start_sentinel() { # N
	local p=$((sport + $1)) d="$data/s$1"
	mkdir -p "$d"
	alive "$d/sentinel.pid" && ping "$p" && return 0
	if [[ ! -f "$d/sentinel.conf" ]]; then
		cat >"$d/sentinel.conf" <<CONF
bind 127.0.0.1
port $p
daemonize yes
pidfile $d/sentinel.pid
logfile $d/sentinel.log
dir $d
sentinel monitor $master 127.0.0.1 $port 2
sentinel down-after-milliseconds $master 1000
sentinel failover-timeout $master 4000
sentinel parallel-syncs $master 1
CONF
	fi
	redis-sentinel "$d/sentinel.conf"
	for _ in $(seq 1 100); do ping "$p" && return 0; sleep 0.1; done
	log "sentinel on $p did not answer; log follows"
	tail -n 20 "$d/sentinel.log" >&2 || true
	exit 1
}

setenv() {
	set_env "$envfile" PARLEY_TEST_REDIS_SENTINELS "127.0.0.1:$sport,127.0.0.1:$((sport + 1)),127.0.0.1:$((sport + 2))"
	set_env "$envfile" PARLEY_TEST_REDIS_MASTER "$master"
}

start() {
	install
	mkdir -p "$data"
	local t0=$SECONDS
	start_redis 0
	start_redis 1
	for i in 0 1 2; do start_sentinel "$i"; done
	touch "$data/started"
	# Ready when a Sentinel names a primary that answers and sees a replica.
	for _ in $(seq 1 200); do
		local pp
		pp=$(primary_port)
		if ping "$pp" && redis-cli -h 127.0.0.1 -p "$pp" info replication 2>/dev/null | grep -q '^connected_slaves:[1-9]'; then
			log "ready in $((SECONDS - t0))s: primary 127.0.0.1:$pp, sentinels 127.0.0.1:$sport-$((sport + 2))"
			setenv
			return 0
		fi
		sleep 0.1
	done
	log "no primary with a replica after 20s"
	exit 1
}

stop() {
	local pidfile
	for i in 0 1 2; do
		pidfile="$data/s$i/sentinel.pid"
		stop_pidfile "$pidfile" 5
	done
	for i in 0 1; do
		pidfile="$data/r$i/redis.pid"
		stop_pidfile "$pidfile" 5
	done
	# A fresh topology next time: the Sentinels' files remember a failover.
	rm -rf "$data"
}

status() {
	local rc=0 pidfile
	for i in 0 1; do
		pidfile="$data/r$i/redis.pid"
		if running && ping $((port + i)); then echo "redis-ha: redis 127.0.0.1:$((port + i)) running"; else echo "redis-ha: redis 127.0.0.1:$((port + i)) not running"; rc=1; fi
	done
	for i in 0 1 2; do
		pidfile="$data/s$i/sentinel.pid"
		if running && ping $((sport + i)); then echo "redis-ha: sentinel 127.0.0.1:$((sport + i)) running"; else echo "redis-ha: sentinel 127.0.0.1:$((sport + i)) not running"; rc=1; fi
	done
	((rc == 0)) && echo "redis-ha: primary 127.0.0.1:$(primary_port)"
	return "$rc"
}

run_action "$@"
