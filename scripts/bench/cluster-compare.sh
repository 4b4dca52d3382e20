#!/usr/bin/env bash
# cluster-compare.sh BENCH BINARY... — old vs new cluster builds, same run
#
# For each BINARY in turn (ROUNDS times, interleaved: A B C A B C ...),
# starts a fresh cluster of it on the shared engines (cluster.sh: 2 chat
# processes, 3 gateways, a keyspace and namespace of its own), runs the
# cluster benchmarks with BENCH, a parley-bench (the same client for
# every build), prints the 1-minute load average before each, the CPU
# time each process and engine spent per ACKed message, and stops it:
#
#   1:1 sends, 1 pair × $M1 and 16 pairs × $M16 messages, 1 in flight
#   3,000-member group fan-out across the 3 gateways, 20 messages at 1/s
#
#   source /tmp/parley-engines/env; export PARLEY_TEST_REDIS PARLEY_TEST_NATS PARLEY_TEST_CASSANDRA
#   scripts/bench/cluster-compare.sh ./parley-bench /tmp/old /tmp/main /tmp/new
#
# ONLY=send or ONLY=fanout runs one kind; CHUNK (default 250) is the
# members per add_members frame of the fan-out's setup. Reports go to stdout; each
# cluster's logs stay under ${BENCH_DIR:-/tmp/parley-bench}/<name>.
set -euo pipefail
: "${PARLEY_TEST_REDIS:?source /tmp/parley-engines/env first}"
here=$(cd "$(dirname "$0")" && pwd)
client=$(realpath "$1")
shift
rounds=${ROUNDS:-1} m1=${M1:-300} m16=${M16:-150} only=${ONLY:-}
root=${BENCH_DIR:-/tmp/parley-bench}
run=$(date +%s)

# tools/cassstat counts the CQL requests and reads of each run's keyspace
# (exact, whatever else the shared node serves).
cassstat=$root/cassstat
(cd "$here/../.." && go build -o "$cassstat" ./tools/cassstat)
cass=${PARLEY_TEST_CASSANDRA%%,*}

jvm=$(pgrep -f CassandraDaemon | head -1 || true)
nats=$(pgrep -f natsserver | head -1 || true)
redis=$(pgrep -f "redis-server $PARLEY_TEST_REDIS" | head -1 || true)
ticks() { [[ -n $1 && -r /proc/$1/stat ]] && awk '{print $14 + $15}' "/proc/$1/stat" || echo 0; }

# measure NAME LABEL N CMD...: runs CMD (a bench of N messages), then
# prints its table and the CPU ms per message (per ACKed one, for sends)
# of each process of cluster NAME.
measure() {
	local name=$1 label=$2 n=$3
	shift 3
	local -A pid before
	while read -r proc p _; do pid[$proc]=$p; done <"$root/$name/procs"
	pid[cassandra]=$jvm pid[nats]=$nats pid[redis]=$redis
	for k in "${!pid[@]}"; do before[$k]=$(ticks "${pid[$k]}"); done
	local busy0 busy1
	busy0=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
	echo "### $label ($(basename "$bin"), load $(cut -d' ' -f1 /proc/loadavg))"
	"$cassstat" -hosts "$cass" -keyspace "$name" >"$root/$name/cql0" 2>/dev/null || true
	"$@" >"$root/$name/full" 2>&1 || echo "(failed: $(grep -v '^|' "$root/$name/full" | tail -1))"
	grep -E '^\|' "$root/$name/full" | tee "$root/$name/out" || true
	busy1=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
	local acked
	acked=$(awk -F'|' '/sent \/ ACKed/ {split($3, a, "/"); gsub(/[ ,]/, "", a[2]); print a[2]}' "$root/$name/out")
	acked=${acked:-$n}
	local line="CPU ms per message (${acked:-?} messages):"
	for k in cassandra c1 c2 g1 g2 g3 nats redis; do
		local d=$(( $(ticks "${pid[$k]}") - ${before[$k]} ))
		line+=" $k $(awk -v d="$d" -v n="${acked:-0}" 'BEGIN{ if (n > 0) printf "%.2f", d * 10 / n; else print "?" }')"
	done
	line+=" | machine $(awk -v d=$((busy1 - busy0)) -v n="${acked:-0}" 'BEGIN{ if (n > 0) printf "%.2f", d * 10 / n; else print "?" }')"
	echo "$line"
	"$cassstat" -hosts "$cass" -keyspace "$name" -since "$root/$name/cql0" -per "${acked:-$n}" 2>/dev/null |
		awk '/^total (requests|read|write) /{printf " %s %s", $2, $3} END{print ""}' | sed 's/^/CQL per message:/' || true
	echo
}

i=0
for round in $(seq "$rounds"); do
	for bin in "$@"; do
		i=$((i + 1))
		name=cmp${run}_$i
		port=$((7800 + 40 * (i % 5)))
		echo "## round $round, $bin ($name)"
		"$here/cluster.sh" up "$bin" "$name" "$port" >/dev/null
		trap '"$here/cluster.sh" down "$name"' EXIT
		sleep 4 # the chat processes share the partitions
		T=$(cat "$root/$name/T")
		if [[ $only != fanout ]]; then
			# shellcheck disable=SC2086
			measure "$name" "1 pair × $m1" "$m1" "$client" send $T -pairs 1 -messages "$m1" -inflight 1
			# shellcheck disable=SC2086
			measure "$name" "16 pairs × $m16" $((16 * m16)) "$client" send $T -pairs 16 -messages "$m16" -inflight 1
		fi
		if [[ $only != send ]]; then
			# shellcheck disable=SC2086
			measure "$name" "3,000 members × 20" 20 "$client" fanout $T -only delivery-3000 -delivery-members 3000 -procs 3 -messages 20 -rate 1 -chunk "${CHUNK:-250}"
		fi
		"$here/cluster.sh" down "$name"
		trap - EXIT
	done
done
