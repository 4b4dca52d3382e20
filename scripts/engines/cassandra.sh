#!/usr/bin/env bash
# scripts/engines/cassandra.sh start|stop|status
#
# A single-node Apache Cassandra 5.0 on 127.0.0.1 for Parley's tests, from
# Maven Central jars on OpenJDK 17 (no Docker, no tarball download).
#
#   start   install what is missing, start the node (unless it runs), wait
#           until system.local says bootstrapped = COMPLETED, then print
#           `export PARLEY_TEST_CASSANDRA=127.0.0.1:PORT` and append it to
#           $PARLEY_ENGINES_DIR/env
#   stop    stop the node this script started (data is kept)
#   status  exit 0 and print the export line if the node is up and ready
#
# Environment (defaults):
#   PARLEY_ENGINES_DIR=/tmp/parley-engines      data in $PARLEY_ENGINES_DIR/cassandra
#   PARLEY_CASSANDRA_PORT=9042                  native (CQL) port
#   PARLEY_CASSANDRA_STORAGE_PORT=7000          internode port
#   PARLEY_CASSANDRA_CACHE=$HOME/.cache/parley/cassandra   jars and Maven repo
#   PARLEY_CASSANDRA_COMMITLOG_SYNC=batch       batch | group (both fsync before ack) | periodic
#   PARLEY_CASSANDRA_GROUP_WINDOW=5ms           commit window of group mode
#   PARLEY_CASSANDRA_START_TIMEOUT=240          seconds to wait for readiness
#   PARLEY_CASSANDRA_HEAP=2g                    JVM heap (-Xms and -Xmx)
# A node of a ring (scripts/engines/cassandra-ring.sh sets these):
#   PARLEY_CASSANDRA_DIR=$PARLEY_ENGINES_DIR/cassandra   the node's directory
#   PARLEY_CASSANDRA_ADDRESS=127.0.0.1          listen and native address
#   PARLEY_CASSANDRA_SEEDS=ADDRESS:STORAGE_PORT the ring's seeds
#   PARLEY_CASSANDRA_INITIAL_TOKEN=0            the node's token (one each)
#   PARLEY_CASSANDRA_ANNOUNCE=1                 0: write no env line
# A fresh node: stop, then rm -rf "$PARLEY_ENGINES_DIR/cassandra".
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
version=5.0.8
engines=${PARLEY_ENGINES_DIR:-/tmp/parley-engines}
dir=${PARLEY_CASSANDRA_DIR:-$engines/cassandra}
address=${PARLEY_CASSANDRA_ADDRESS:-127.0.0.1}
port=${PARLEY_CASSANDRA_PORT:-9042}
storage_port=${PARLEY_CASSANDRA_STORAGE_PORT:-7000}
seeds=${PARLEY_CASSANDRA_SEEDS:-$address:$storage_port}
initial_token=${PARLEY_CASSANDRA_INITIAL_TOKEN:-0}
heap=${PARLEY_CASSANDRA_HEAP:-2g}
cache=${PARLEY_CASSANDRA_CACHE:-$HOME/.cache/parley/cassandra}
lib=$cache/$version/lib
sync_mode=${PARLEY_CASSANDRA_COMMITLOG_SYNC:-batch}
start_timeout=${PARLEY_CASSANDRA_START_TIMEOUT:-240}
java_home=/usr/lib/jvm/java-17-openjdk-amd64
pidfile=$dir/cassandra.pid
ready=$dir/bin/cassandra-ready
addr=$address:$port
export_line="export PARLEY_TEST_CASSANDRA=$addr"

log() { echo "cassandra.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
die() {
	log "$*"
	exit 1
}

# Flags of conf/jvm17-server.options and conf/jvm-server.options of
# Cassandra 5.0 that a node started without bin/cassandra needs.
jvm17_flags=(
	-Djdk.attach.allowAttachSelf=true
	--add-exports java.base/jdk.internal.misc=ALL-UNNAMED
	--add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
	--add-exports java.management/com.sun.jmx.remote.security=ALL-UNNAMED
	--add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
	--add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
	--add-exports java.sql/java.sql=ALL-UNNAMED
	--add-exports java.base/java.lang.ref=ALL-UNNAMED
	--add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
	--add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
	--add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
	--add-opens java.base/java.lang.module=ALL-UNNAMED
	--add-opens java.base/jdk.internal.loader=ALL-UNNAMED
	--add-opens java.base/jdk.internal.ref=ALL-UNNAMED
	--add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
	--add-opens java.base/jdk.internal.math=ALL-UNNAMED
	--add-opens java.base/jdk.internal.module=ALL-UNNAMED
	--add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
	--add-opens java.base/sun.nio.ch=ALL-UNNAMED
	--add-opens java.base/java.io=ALL-UNNAMED
	--add-opens java.base/java.lang.reflect=ALL-UNNAMED
	--add-opens java.base/java.lang=ALL-UNNAMED
	--add-opens java.base/java.util=ALL-UNNAMED
	--add-opens java.base/java.nio=ALL-UNNAMED
	--add-opens java.base/java.nio.charset=ALL-UNNAMED
	--add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
	--add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
	-Dio.netty.tryReflectionSetAccessible=true
	-Djava.net.preferIPv4Stack=true
	-Dchronicle.analytics.disable=true
	-Xss256k
	-XX:+UseG1GC
)

apt_updated=
apt_install() {
	command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
	if [[ -z $apt_updated ]]; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install_java() {
	[[ -x $java_home/bin/java ]] && return
	log "installing OpenJDK 17 (apt)"
	apt_install openjdk-17-jre-headless
	[[ -x $java_home/bin/java ]] || die "no $java_home/bin/java after installing openjdk-17-jre-headless"
}

# install_jars resolves cassandra-all and its runtime dependencies into
# $lib once; the Maven repository stays in the cache so a rebuild is cheap.
install_jars() {
	[[ -f $lib/.complete ]] && return
	if ! command -v mvn >/dev/null; then
		log "installing Maven (apt)"
		apt_install maven
	fi
	log "resolving org.apache.cassandra:cassandra-all:$version from Maven Central"
	local tmp=$cache/$version/lib.tmp
	rm -rf "$tmp"
	mkdir -p "$tmp"
	if ! JAVA_HOME=$java_home mvn -B -q -f "$here/cassandra/pom.xml" \
		-Dmaven.repo.local="$cache/m2" -Dcassandra.version="$version" \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
		>"$cache/$version/mvn.log" 2>&1; then
		tail -n 30 "$cache/$version/mvn.log" >&2
		die "Maven failed; full log in $cache/$version/mvn.log"
	fi
	touch "$tmp/.complete"
	rm -rf "$lib"
	mv "$tmp" "$lib"
}

build_ready() {
	mkdir -p "$dir/bin"
	(cd "$repo" && go build -o "$ready" ./internal/store/cassandra/cmd/cassandra-ready)
}

running() {
	[[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

port_busy() {
	(exec 3<>"/dev/tcp/$address/$1") 2>/dev/null
}

render_config() {
	local sync_opts
	case $sync_mode in
	group) sync_opts="commitlog_sync_group_window: ${PARLEY_CASSANDRA_GROUP_WINDOW:-5ms}" ;;
	batch) sync_opts="" ;;
	periodic) sync_opts="commitlog_sync_period: 10000ms" ;;
	*) die "PARLEY_CASSANDRA_COMMITLOG_SYNC=$sync_mode: want group, batch or periodic" ;;
	esac
	sed -e "s|@STORAGE_PORT@|$storage_port|g" \
		-e "s|@ADDRESS@|$address|g" \
		-e "s|@SEEDS@|$seeds|g" \
		-e "s|@INITIAL_TOKEN@|$initial_token|g" \
		-e "s|@NATIVE_PORT@|$port|g" \
		-e "s|@COMMITLOG_SYNC@|$sync_mode|g" \
		-e "s|@COMMITLOG_SYNC_OPTS@|$sync_opts|g" \
		"$here/cassandra/cassandra.yaml" >"$dir/cassandra.yaml"
}

announce() {
	[[ ${PARLEY_CASSANDRA_ANNOUNCE:-1} == 0 ]] && return
	set_env "$engines/env" PARLEY_TEST_CASSANDRA "$addr"
}

start() {
	mkdir -p "$dir/logs"
	if running; then
		[[ -x $ready ]] || build_ready
		"$ready" -addr "$addr" -timeout "${start_timeout}s" || die "running (pid $(cat "$pidfile")) but not ready"
		announce
		return
	fi
	for p in "$port" "$storage_port"; do
		port_busy "$p" && die "port $p is taken by another process"
	done
	local t0=$SECONDS
	install_java
	install_jars
	build_ready
	render_config
	log "installed in $((SECONDS - t0))s; starting Cassandra $version on $addr (data $dir)"
	local jamm
	jamm=$(ls "$lib"/jamm-*.jar)
	(
		cd "$dir"
		exec setsid "$java_home/bin/java" -Xms"$heap" -Xmx"$heap" -XX:+ExitOnOutOfMemoryError \
			"${jvm17_flags[@]}" \
			-javaagent:"$jamm" \
			-Dcassandra.config="file://$dir/cassandra.yaml" \
			-Dcassandra.storagedir="$dir" \
			-Dcassandra.logdir="$dir/logs" \
			-Dlogback.configurationFile="$here/cassandra/logback.xml" \
			-Dcassandra-foreground=yes \
			-Dcassandra.skip_wait_for_gossip_to_settle=0 \
			-Dcassandra.load_ring_state=false \
			-cp "$lib/*" org.apache.cassandra.service.CassandraDaemon \
			</dev/null >"$dir/logs/stdout.log" 2>&1
	) &
	echo $! >"$pidfile"
	local t1=$SECONDS
	# Poll in short rounds so a JVM that died is reported at once.
	until "$ready" -addr "$addr" -timeout 5s 2>/dev/null; do
		if ! running; then
			tail -n 20 "$dir/logs/stdout.log" >&2 || true
			die "Cassandra exited during startup; logs in $dir/logs"
		fi
		if ((SECONDS - t1 > start_timeout)); then
			die "not ready after ${start_timeout}s; logs in $dir/logs"
		fi
	done
	log "ready in $((SECONDS - t1))s (total $((SECONDS - t0))s)"
	announce
}

stop() { stop_pidfile "$pidfile" 30; }

status() {
	if running && [[ -x $ready ]] && "$ready" -addr "$addr" -timeout 5s; then
		echo "$export_line"
		return 0
	fi
	log "not running or not ready"
	return 1
}

run_action "$@"
