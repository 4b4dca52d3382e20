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
#   (FANOUT_MEMBERS, FANOUT_ONLINE, FANOUT_MESSAGES, FANOUT_RATE change it:
#   e.g. 100000 members of which 3000 online, or 1000 messages at 100/s)
#
#   source /tmp/parley-engines/env; export PARLEY_TEST_REDIS PARLEY_TEST_NATS PARLEY_TEST_CASSANDRA
#   scripts/bench/cluster-compare.sh ./parley-bench /tmp/old /tmp/main /tmp/new
#
# A BINARY written ha:BINARY runs on the HA topology (cluster.sh's
# ENGINES=ha: Redis behind Sentinel, NATS R3, Cassandra RF 3 on a 3-node
# ring), the others on the single-node engines; the engines' CPU is then
# the sum over their nodes (the Sentinels included in Redis's), and the
# Redis commands are the primary's. The CQL counts are skipped on the ring
# (cassstat reads one node's views). Start the HA engines first (in
# another directory than the shared engines' if HA_ENGINES_DIR names it):
#
#   for e in redis-ha nats-cluster cassandra-ring; do scripts/engines/$e.sh start; done
#   source /tmp/parley-engines/env; export PARLEY_TEST_REDIS_SENTINELS PARLEY_TEST_REDIS_MASTER \
#     PARLEY_TEST_NATS_CLUSTER PARLEY_TEST_CASSANDRA_RING
#   scripts/bench/cluster-compare.sh ./parley-bench /tmp/main ha:/tmp/main
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
fm=${FANOUT_MEMBERS:-3000} fo=${FANOUT_ONLINE:-${FANOUT_MEMBERS:-3000}} fn=${FANOUT_MESSAGES:-20} fr=${FANOUT_RATE:-1}
scenario=delivery-$fm
[[ $fo == "$fm" ]] || scenario+=-online-$fo
root=${BENCH_DIR:-/tmp/parley-bench}
run=$(date +%s)

# tools/cassstat counts the CQL requests and reads of each run's keyspace
# (exact, whatever else the shared node serves).
cassstat=$root/cassstat
(cd "$here/../.." && go build -o "$cassstat" ./tools/cassstat)
cass=${PARLEY_TEST_CASSANDRA%%,*}

# The HA engines' directory (their pid files): HA_ENGINES_DIR, else the
# engines' own.
engines=${HA_ENGINES_DIR:-${PARLEY_ENGINES_DIR:-/tmp/parley-engines}}
# pidof_port PORT: the pid of the process listening on PORT (any
# address), empty if none.
pidof_port() { ss -Hltnp "sport = :$1" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1; }
single_jvm=$(pidof_port "${PARLEY_TEST_CASSANDRA##*:}")
single_nats=$(pidof_port "${PARLEY_TEST_NATS##*:}")
single_redis=$(pidof_port "${PARLEY_TEST_REDIS##*:}")
# The HA engines' pids, space-separated: each node's pid file.
# (a pid file need not end in a newline: NATS's does not).
pidfiles() { local f; for f in "$@"; do [[ -f $f ]] && echo -n "$(cat "$f") "; done; return 0; }
ha_jvm=$(pidfiles "$engines"/cassandra-ring/n*/cassandra.pid)
ha_nats=$(pidfiles "$engines"/nats-cluster/n*/nats.pid)
ha_redis=$(pidfiles "$engines"/redis-ha/r*/redis.pid "$engines"/redis-ha/s*/sentinel.pid)
# ticks PID...: the CPU ticks the processes used so far, summed.
ticks() {
	local p t=0
	for p in "$@"; do
		[[ -r /proc/$p/stat ]] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}

# redis_calls: the Redis server's commands so far, one "COMMAND CALLS"
# line each (on the HA topology the primary's, as the Sentinels name it).
redis_calls() {
	local addr=$PARLEY_TEST_REDIS
	if [[ $topology == ha ]]; then
		addr=$(redis-cli -h "${PARLEY_TEST_REDIS_SENTINELS%%:*}" -p "$(echo "${PARLEY_TEST_REDIS_SENTINELS%%,*}" | cut -d: -f2)" \
			sentinel get-master-addr-by-name "${PARLEY_TEST_REDIS_MASTER:-parley}" 2>/dev/null | paste -sd:)
	fi
	redis-cli -h "${addr%%:*}" -p "${addr##*:}" info commandstats 2>/dev/null |
		awk -F'[:=,]' '/^cmdstat_/ {sub(/^cmdstat_/, "", $1); print $1, $3}'
}

# redis_per N BEFORE AFTER: the commands per message between two
# redis_calls, in all and by command, most first. The lease scripts and
# renewals (eval, evalsha, pexpire) and the registry's session refreshes
# run on timers whatever is sent: the breakdown tells them apart.
redis_per() {
	awk -v n="$1" 'FNR == NR {b[$1] = $2; next} {d = $2 - b[$1]; if (d > 0) {t += d; c[$1] = d}}
		END {
			if (n <= 0) exit
			printf "Redis commands per message: %.2f (", t / n
			k = 0
			while (length(c) > 0) {
				m = ""; for (x in c) if (m == "" || c[x] > c[m]) m = x
				printf "%s%s %.2f", (k++ ? ", " : ""), m, c[m] / n; delete c[m]
			}
			print ")"
		}' <(echo "$2") <(echo "$3")
}

# measure NAME LABEL N CMD...: runs CMD (a bench of N messages), then
# prints its table and, per message (per ACKed one, for sends), the CPU ms
# of each process of cluster NAME and of the engines, the Redis commands
# and the CQL requests. A fan-out bench is measured over its sending window
# only (-window-file: its members online, from the first send to the last
# delivery), so the group's setup and the members' logins are left out;
# a send bench over the whole command.
measure() {
	local name=$1 label=$2 n=$3
	shift 3
	local -A pid before
	while read -r proc p _; do pid[$proc]=$p; done <"$root/$name/procs"
	if [[ $topology == ha ]]; then
		pid[cassandra]=$ha_jvm pid[nats]=$ha_nats pid[redis]=$ha_redis
	else
		pid[cassandra]=$single_jvm pid[nats]=$single_nats pid[redis]=$single_redis
	fi
	local busy0 busy1 calls0 calls1 window="" scope="the whole run"
	snap0() {
		# shellcheck disable=SC2086 # a list of pids
		for k in "${!pid[@]}"; do before[$k]=$(ticks ${pid[$k]}); done
		busy0=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
		calls0=$(redis_calls)
		[[ $topology == ha ]] || "$cassstat" -hosts "$cass" -keyspace "$name" >"$root/$name/cql0" 2>/dev/null || true
	}
	snap1() {
		busy1=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
		calls1=$(redis_calls)
		local k
		# shellcheck disable=SC2086 # a list of pids
		for k in "${!pid[@]}"; do before[$k]=$(($(ticks ${pid[$k]}) - ${before[$k]})); done
		rm -f "$root/$name/cql1"
		[[ $topology == ha ]] || "$cassstat" -hosts "$cass" -keyspace "$name" -since "$root/$name/cql0" -per "$n" >"$root/$name/cql1" 2>/dev/null || true
	}
	echo "### $label ($(basename "$bin"), $topology engines, load $(cut -d' ' -f1 /proc/loadavg))"
	if [[ " $* " == *" fanout "* ]]; then
		window=$root/$name/window scope="the sending window"
		rm -f "$window"
		"$@" -window-file "$window" >"$root/$name/full" 2>&1 &
		local bench=$! took0=0 took1=0
		until grep -q '^start ' "$window" 2>/dev/null || ! kill -0 "$bench" 2>/dev/null; do sleep 0.05; done
		snap0
		took0=$(date +%s%N)
		until grep -q '^end ' "$window" 2>/dev/null || ! kill -0 "$bench" 2>/dev/null; do sleep 0.05; done
		snap1
		took1=$(date +%s%N)
		wait "$bench" || echo "(failed: $(grep -v '^|' "$root/$name/full" | tail -1))"
		scope+=", $(((took1 - took0) / 1000000)) ms"
	else
		snap0
		"$@" >"$root/$name/full" 2>&1 || echo "(failed: $(grep -v '^|' "$root/$name/full" | tail -1))"
		snap1
	fi
	grep -E '^\|' "$root/$name/full" | tee "$root/$name/out" || true
	local acked
	acked=$(awk -F'|' '/sent \/ ACKed/ {split($3, a, "/"); gsub(/[ ,]/, "", a[2]); print a[2]}' "$root/$name/out")
	acked=${acked:-$n}
	local line="CPU ms per message (${acked:-?} messages, $scope):"
	for k in cassandra c1 c2 g1 g2 g3 nats redis; do
		line+=" $k $(awk -v d="${before[$k]}" -v n="${acked:-0}" 'BEGIN{ if (n > 0) printf "%.2f", d * 10 / n; else print "?" }')"
	done
	line+=" | machine $(awk -v d=$((busy1 - busy0)) -v n="${acked:-0}" 'BEGIN{ if (n > 0) printf "%.2f", d * 10 / n; else print "?" }')"
	echo "$line"
	redis_per "${acked:-0}" "$calls0" "$calls1"
	awk '/^total (requests|read|write) /{printf " %s %s", $2, $3} END{print ""}' "$root/$name/cql1" 2>/dev/null | sed 's/^/CQL per message:/' || true
	echo
}

i=0
for round in $(seq "$rounds"); do
	for arg in "$@"; do
		i=$((i + 1))
		name=cmp${run}_$i
		port=$((7800 + 40 * (i % 5)))
		bin=${arg#ha:} topology=single
		[[ $arg == ha:* ]] && topology=ha
		echo "## round $round, $bin on the $topology engines ($name)"
		[[ $topology == ha ]] && export ENGINES=ha || unset ENGINES
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
			measure "$name" "$fm members ($fo online) × $fn at $fr/s" "$fn" "$client" fanout $T -only "$scenario" \
				-delivery-members "$fm" -delivery-online "$fo" -procs 3 -messages "$fn" -rate "$fr" -chunk "${CHUNK:-250}"
		fi
		"$here/cluster.sh" down "$name"
		trap - EXIT
	done
done
