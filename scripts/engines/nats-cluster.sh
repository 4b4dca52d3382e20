#!/usr/bin/env bash
# Runs a 3-node NATS cluster with JetStream on loopback (the HA topology
# of scripts/bench/cluster-compare.sh; the failover test starts its own
# in Go): servers n0..n2 on client ports ${PARLEY_NATS_CLUSTER_PORT:-4260}
# and the two next, routes on ${PARLEY_NATS_CLUSTER_ROUTE_PORT:-6260} and
# the two next, monitoring on ${PARLEY_NATS_CLUSTER_MONITOR_PORT:-8260} and
# the two next, file storage under
# ${PARLEY_ENGINES_DIR:-/tmp/parley-engines}/nats-cluster/nN.
#
#   scripts/engines/nats-cluster.sh start|stop|status
#
# start builds scripts/engines/natsserver as nats.sh does, starts the
# three servers, waits until JetStream has a meta leader, and records
#   export PARLEY_TEST_NATS_CLUSTER=nats://127.0.0.1:4260,nats://127.0.0.1:4261,nats://127.0.0.1:4262
# in ${PARLEY_ENGINES_DIR}/env (also printed). Idempotent; it also brings
# back a server that was killed. stop keeps the stores (rm -rf the
# directory for a fresh cluster).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${PARLEY_ENGINES_DIR:-/tmp/parley-engines}"
port="${PARLEY_NATS_CLUSTER_PORT:-4260}"
rport="${PARLEY_NATS_CLUSTER_ROUTE_PORT:-6260}"
mport="${PARLEY_NATS_CLUSTER_MONITOR_PORT:-8260}"
data="$dir/nats-cluster"
bin="$dir/bin/natsserver"
envfile="$dir/env"

log() { echo "nats-cluster.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
# running: used by stop_pidfile with $pidfile set.
running() { alive "$pidfile"; }

urls() { echo "nats://127.0.0.1:$port,nats://127.0.0.1:$((port + 1)),nats://127.0.0.1:$((port + 2))"; }

# leader: some server names a JetStream meta leader.
leader() {
	local i
	for i in 0 1 2; do
		timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$((mport + i)) &&
			printf 'GET /jsz HTTP/1.0\r\n\r\n' >&3 && cat <&3" 2>/dev/null |
			grep -q '"leader": *"n[0-2]"' && return 0
	done
	return 1
}

start_node() { # N
	local n=$1 d="$data/n$1" routes
	mkdir -p "$d/store"
	alive "$d/nats.pid" && return 0
	routes="nats://127.0.0.1:$rport,nats://127.0.0.1:$((rport + 1)),nats://127.0.0.1:$((rport + 2))"
	# setsid: the server must outlive this script and its caller's process group.
	setsid "$bin" -js -n "n$n" --cluster_name parley -a 127.0.0.1 -p $((port + n)) -m $((mport + n)) \
		--cluster "nats://127.0.0.1:$((rport + n))" --routes "$routes" \
		-sd "$d/store" -P "$d/nats.pid" -l "$d/nats.log" </dev/null >/dev/null 2>&1 &
	for _ in $(seq 100); do alive "$d/nats.pid" && return 0; sleep 0.1; done
	log "server n$n did not start; log follows"
	tail -n 20 "$d/nats.log" >&2 || true
	exit 1
}

start() {
	export PATH="/usr/local/go/bin:$PATH"
	mkdir -p "$(dirname "$bin")" "$data"
	(cd "$root" && go build -o "$bin" ./scripts/engines/natsserver)
	local t0=$SECONDS i
	for i in 0 1 2; do start_node "$i"; done
	until leader; do
		if ((SECONDS - t0 > 60)); then
			log "no JetStream meta leader after 60s"
			exit 1
		fi
		sleep 0.2
	done
	log "ready in $((SECONDS - t0))s: $(urls)"
	set_env "$envfile" PARLEY_TEST_NATS_CLUSTER "$(urls)"
}

stop() {
	local pidfile i
	for i in 2 1 0; do
		pidfile="$data/n$i/nats.pid"
		stop_pidfile "$pidfile" 10
	done
}

status() {
	local rc=0 pidfile i
	for i in 0 1 2; do
		pidfile="$data/n$i/nats.pid"
		if running; then echo "nats-cluster: n$i 127.0.0.1:$((port + i)) running"; else echo "nats-cluster: n$i 127.0.0.1:$((port + i)) not running"; rc=1; fi
	done
	((rc == 0)) && leader && echo "export PARLEY_TEST_NATS_CLUSTER=$(urls)"
	return "$rc"
}

run_action "$@"
