#!/usr/bin/env bash
# Runs a 3-node Cassandra 5.0 ring on loopback for the failover tests:
# nodes on 127.0.0.1, 127.0.0.2 and 127.0.0.3 (the whole of 127/8 is
# loopback on Linux), all on the same two ports, each started by
# scripts/engines/cassandra.sh (its jars, JVM flags and config) with a
# token of its own and a small heap. internal/clustertest's
# TestCassandraNodeFailoverMidStorm runs a ring of its own through this
# script (its own directory and ports).
#
#   scripts/engines/cassandra-ring.sh start|stop|status
#
# The first node is the seed; the others join one after another, each
# once the one before is ready (system.local bootstrapped = COMPLETED)
# and sees its peers. Ports: native (CQL) ${PARLEY_CASSANDRA_RING_PORT:-9044},
# internode ${PARLEY_CASSANDRA_RING_STORAGE_PORT:-7020}; heap
# ${PARLEY_CASSANDRA_RING_HEAP:-640m} per node. Data in
# ${PARLEY_ENGINES_DIR:-/tmp/parley-engines}/cassandra-ring/n0..n2 (kept by
# stop; start on it again restarts the same ring; rm -rf it for a fresh
# one). start records
#   export PARLEY_TEST_CASSANDRA_RING=127.0.0.1:9044,127.0.0.2:9044,127.0.0.3:9044
# in ${PARLEY_ENGINES_DIR}/env (also printed). start is idempotent and
# also brings back a node a test killed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
engines=${PARLEY_ENGINES_DIR:-/tmp/parley-engines}
data=$engines/cassandra-ring
port=${PARLEY_CASSANDRA_RING_PORT:-9044}
storage_port=${PARLEY_CASSANDRA_RING_STORAGE_PORT:-7020}
heap=${PARLEY_CASSANDRA_RING_HEAP:-640m}
nodes=3
# Murmur3 tokens spread evenly over the ring (with RF 3 every node holds
# every row anyway).
tokens=(-9223372036854775808 -3074457345618258603 3074457345618258602)

log() { echo "cassandra-ring.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$here/lib.sh"

address() { echo "127.0.0.$(($1 + 1))"; }

# node N ACTION: cassandra.sh ACTION for node N.
node() {
	PARLEY_CASSANDRA_DIR="$data/n$1" \
		PARLEY_CASSANDRA_ADDRESS="$(address "$1")" \
		PARLEY_CASSANDRA_PORT="$port" \
		PARLEY_CASSANDRA_STORAGE_PORT="$storage_port" \
		PARLEY_CASSANDRA_SEEDS="$(address 0):$storage_port" \
		PARLEY_CASSANDRA_INITIAL_TOKEN="${tokens[$1]}" \
		PARLEY_CASSANDRA_HEAP="$heap" \
		PARLEY_CASSANDRA_ANNOUNCE=0 \
		"$here/cassandra.sh" "$2"
}

hosts() {
	local out=() i
	for ((i = 0; i < nodes; i++)); do out+=("$(address "$i"):$port"); done
	(IFS=,; echo "${out[*]}")
}

start() {
	local t0=$SECONDS i
	mkdir -p "$data"
	for ((i = 0; i < nodes; i++)); do
		local t1=$SECONDS
		node "$i" start
		log "node $i ($(address "$i"):$port) ready in $((SECONDS - t1))s"
	done
	# Ready when every node knows the others (gossip tells the earlier
	# nodes of the last one a moment after it is up).
	for ((i = 0; i < nodes; i++)); do
		"$data/n$i/bin/cassandra-ready" -addr "$(address "$i"):$port" -peers $((nodes - 1)) -timeout 60s ||
			{ log "node $i does not see $((nodes - 1)) peers after 60s"; exit 1; }
	done
	log "ring of $nodes ready in $((SECONDS - t0))s: $(hosts)"
	set_env "$engines/env" PARLEY_TEST_CASSANDRA_RING "$(hosts)"
}

stop() {
	local i rc=0
	for ((i = nodes - 1; i >= 0; i--)); do node "$i" stop || rc=1; done
	return "$rc"
}

status() {
	local i rc=0
	for ((i = 0; i < nodes; i++)); do
		if node "$i" status >/dev/null 2>&1; then
			echo "cassandra-ring: $(address "$i"):$port running"
		else
			echo "cassandra-ring: $(address "$i"):$port not running"
			rc=1
		fi
	done
	((rc == 0)) && echo "export PARLEY_TEST_CASSANDRA_RING=$(hosts)"
	return "$rc"
}

run_action "$@"
