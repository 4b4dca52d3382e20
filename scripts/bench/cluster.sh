#!/usr/bin/env bash
# cluster.sh up BINARY NAME PORTBASE | down NAME
#
# Starts (up) or stops (down) a benchmark cluster of BINARY on the shared
# engines of scripts/engines (source /tmp/parley-engines/env first): 2 chat
# processes and 3 gateways, on keyspace and namespace NAME (private to the
# run: several clusters share the engines), listening on PORTBASE+1..2
# (chat) and PORTBASE+11..13 (gateways), each with pprof on PORTBASE+21..25
# (PARLEY_PPROF; builds without it ignore it). Its files go under
# ${BENCH_DIR:-/tmp/parley-bench}/NAME: logs, pids, and T — the
# `-urls/-key/-chats` flags of `parley-bench` for this cluster:
#
#   scripts/bench/cluster.sh up ./parley pb1 7400
#   ./parley-bench send $(cat /tmp/parley-bench/pb1/T) -pairs 16 -messages 200 -inflight 1
#   scripts/bench/cluster.sh down pb1
#
# The gateways' per-user and per-connection limits are lifted as
# `parley-bench` does for a node it starts; a build that refuses one of
# those flags is started without them. down drops the keyspace's data
# only by leaving it: rerun with a fresh NAME for a fresh keyspace.
#
# ENGINES=ha puts the cluster on the HA topology instead: Redis behind
# Sentinel (PARLEY_TEST_REDIS_SENTINELS, PARLEY_TEST_REDIS_MASTER from
# scripts/engines/redis-ha.sh), a 3-node NATS (PARLEY_TEST_NATS_CLUSTER,
# nats-cluster.sh) with the lease bucket and streams at R3, and a 3-node
# Cassandra ring (PARLEY_TEST_CASSANDRA_RING, cassandra-ring.sh) with the
# keyspace at RF 3.
set -euo pipefail
: "${PARLEY_TEST_REDIS:?source /tmp/parley-engines/env first}"
root=${BENCH_DIR:-/tmp/parley-bench}

case ${1:-} in
down)
	dir=$root/$2
	if [[ -f $dir/pids ]]; then
		# Only the processes this script started, by pid.
		while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$dir/pids"
		while read -r pid; do
			for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -9 "$pid" 2>/dev/null || true
		done <"$dir/pids"
		rm -f "$dir/pids"
	fi
	exit 0
	;;
up) ;;
*)
	echo "usage: $0 up BINARY NAME PORTBASE | down NAME" >&2
	exit 2
	;;
esac

bin=$(realpath "$2") name=$3 base=$4
dir=$root/$name
mkdir -p "$dir"
: >"$dir/pids"
key=$(openssl rand -hex 32)
common=(--cluster.redis "$PARLEY_TEST_REDIS" --cluster.nats "$PARLEY_TEST_NATS"
	--cluster.cassandra-hosts "$PARLEY_TEST_CASSANDRA")
if [[ ${ENGINES:-} == ha ]]; then
	: "${PARLEY_TEST_REDIS_SENTINELS:?start scripts/engines/redis-ha.sh and source its env}"
	: "${PARLEY_TEST_NATS_CLUSTER:?start scripts/engines/nats-cluster.sh and source its env}"
	: "${PARLEY_TEST_CASSANDRA_RING:?start scripts/engines/cassandra-ring.sh and source its env}"
	common=(--cluster.redis "${PARLEY_TEST_REDIS_MASTER:-parley}" --cluster.redis-sentinels "$PARLEY_TEST_REDIS_SENTINELS"
		--cluster.nats "$PARLEY_TEST_NATS_CLUSTER" --cluster.jetstream-replicas 3
		--cluster.cassandra-hosts "$PARLEY_TEST_CASSANDRA_RING" --cluster.replication-factor 3)
fi
common+=(--cluster.keyspace "$name"
	--cluster.namespace "$name" --auth.hs256-key "$key" --log.level warn
	--attach.max-file-bytes 0)
unthrottled=(--gateway.max-connections 20000 --gateway.handshake-rate 100000 --gateway.handshake-burst 100000
	--gateway.user-send-rate 1e9 --gateway.user-send-burst 1000000000
	--gateway.conn-request-rate 1e9 --gateway.conn-request-burst 1000000000
	--gateway.max-sessions-per-user 1000000 --gateway.max-poll-sessions-per-user 1000000
	--gateway.user-handshake-rate 1e9 --gateway.user-handshake-burst 1000000000
	--gateway.source-accept-rate 0)

# Schema changes time out now and then on a busy shared Cassandra: retry.
for attempt in 1 2 3 4 5; do
	if "$bin" migrate "${common[@]}" >"$dir/migrate.log" 2>&1; then break; fi
	[[ $attempt == 5 ]] && { cat "$dir/migrate.log" >&2; exit 1; }
	sleep 5
done

# start NAME PORT PPROFPORT ARGS...: one process, waiting for its port.
start() {
	local n=$1 port=$2 pp=$3
	shift 3
	PARLEY_PPROF=127.0.0.1:$pp "$bin" serve --node-id "$name-$n" --listen 127.0.0.1:$port \
		--data-dir "$dir/$n" "${common[@]}" "$@" >"$dir/$n.log" 2>&1 &
	local pid=$!
	for _ in $(seq 300); do
		if ! kill -0 "$pid" 2>/dev/null; then return 1; fi
		if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
			echo "$pid" >>"$dir/pids"
			echo "$n $pid $port pprof=$pp" >>"$dir/procs"
			return 0
		fi
		sleep 0.1
	done
	kill "$pid"
	return 1
}
: >"$dir/procs"
for i in 1 2; do
	start c$i $((base + i)) $((base + 20 + i)) --roles chat
done
for i in 1 2 3; do
	start g$i $((base + 10 + i)) $((base + 22 + i)) --roles gateway "${unthrottled[@]}" ||
		start g$i $((base + 10 + i)) $((base + 22 + i)) --roles gateway --gateway.max-connections 20000 \
			--gateway.handshake-rate 100000 --gateway.handshake-burst 100000
done
echo "-urls ws://127.0.0.1:$((base + 11)),ws://127.0.0.1:$((base + 12)),ws://127.0.0.1:$((base + 13)) -key $key -chats 127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))" >"$dir/T"
cat "$dir/procs"
