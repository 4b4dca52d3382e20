#!/usr/bin/env bash
# scripts/engines/opensearch.sh start|stop|status
#
# A single-node OpenSearch 2.19 on 127.0.0.1 for cluster-mode search and
# its tests, from Maven Central on OpenJDK 17 (no Docker, no download site):
# the integ-test distribution zip (server, transport-netty4) and the
# analysis-common module jar, which holds the CJK filters (cjk_width,
# cjk_bigram) and is installed as a module with a descriptor of our own.
# Security is off (the distribution has no security plugin); the node
# listens on loopback only.
#
#   start   install what is missing, start the node (unless it runs), wait
#           until the cluster is green, then print
#           `export PARLEY_TEST_OPENSEARCH=http://127.0.0.1:PORT` and record
#           it in $PARLEY_ENGINES_DIR/env
#   stop    stop the node this script started (data is kept)
#   status  exit 0 and print the export line if the node is up and green
#
# OpenSearch refuses to run as root: under root the node runs as nobody,
# and its directory is theirs.
#
# Environment (defaults):
#   PARLEY_ENGINES_DIR=/tmp/parley-engines      data in $PARLEY_ENGINES_DIR/opensearch
#   PARLEY_OPENSEARCH_PORT=9200                 HTTP port
#   PARLEY_OPENSEARCH_TRANSPORT_PORT=9300       transport port (no peers; still bound)
#   PARLEY_OPENSEARCH_HEAP=512m                 -Xms and -Xmx
#   PARLEY_OPENSEARCH_CACHE=$HOME/.cache/parley/opensearch   zip, jar and Maven repo
#   PARLEY_OPENSEARCH_START_TIMEOUT=180         seconds to wait for readiness
# A fresh node: stop, then rm -rf "$PARLEY_ENGINES_DIR/opensearch".
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=2.19.6
engines=${PARLEY_ENGINES_DIR:-/tmp/parley-engines}
dir=$engines/opensearch
port=${PARLEY_OPENSEARCH_PORT:-9200}
transport_port=${PARLEY_OPENSEARCH_TRANSPORT_PORT:-9300}
heap=${PARLEY_OPENSEARCH_HEAP:-512m}
cache=${PARLEY_OPENSEARCH_CACHE:-$HOME/.cache/parley/opensearch}
start_timeout=${PARLEY_OPENSEARCH_START_TIMEOUT:-180}
java_home=/usr/lib/jvm/java-17-openjdk-amd64
home=$dir/opensearch-$version
pidfile=$dir/opensearch.pid
url=http://127.0.0.1:$port

log() { echo "opensearch.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$here/lib.sh"
die() {
	log "$*"
	exit 1
}

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

# mvn_copy ARTIFACT DIR: copies one artifact from Maven Central into DIR,
# keeping the Maven repository in the cache.
mvn_copy() {
	if ! command -v mvn >/dev/null; then
		log "installing Maven (apt)"
		apt_install maven
	fi
	mkdir -p "$2"
	if ! JAVA_HOME=$java_home mvn -B -q -Dmaven.repo.local="$cache/m2" \
		dependency:copy -Dartifact="$1" -DoutputDirectory="$2" >"$cache/mvn.log" 2>&1; then
		tail -n 30 "$cache/mvn.log" >&2
		die "Maven failed to fetch $1; full log in $cache/mvn.log"
	fi
}

# install_dist fetches the distribution zip and the analysis-common jar
# into the cache once.
install_dist() {
	local zip=$cache/$version/opensearch-$version.zip jar=$cache/$version/analysis-common-$version.jar
	if [[ ! -f $zip ]]; then
		log "fetching org.opensearch.distribution.integ-test-zip:opensearch:$version:zip from Maven Central"
		mvn_copy "org.opensearch.distribution.integ-test-zip:opensearch:$version:zip" "$cache/$version"
	fi
	if [[ ! -f $jar ]]; then
		log "fetching org.opensearch.plugin:analysis-common:$version from Maven Central"
		mvn_copy "org.opensearch.plugin:analysis-common:$version" "$cache/$version"
	fi
}

# unpack lays the distribution out under $dir once, with analysis-common
# as a module. Its descriptor names no extended plugin: the jar's only tie
# to lang-painless is a Painless whitelist extension, which nothing loads
# without Painless.
unpack() {
	[[ -f $home/.complete ]] && return
	local tmp=$dir/unpack.tmp
	rm -rf "$tmp" "$home"
	mkdir -p "$tmp"
	(cd "$tmp" && python3 -m zipfile -e "$cache/$version/opensearch-$version.zip" .)
	local m=$tmp/opensearch-$version/modules/analysis-common
	mkdir -p "$m"
	cp "$cache/$version/analysis-common-$version.jar" "$m/"
	cat >"$m/plugin-descriptor.properties" <<EOF
description=Adds "built in" analyzers to OpenSearch.
version=$version
name=analysis-common
classname=org.opensearch.analysis.common.CommonAnalysisPlugin
java.version=11
opensearch.version=$version
custom.foldername=
extended.plugins=
has.native.controller=false
EOF
	chmod +x "$tmp/opensearch-$version"/bin/*
	touch "$tmp/opensearch-$version/.complete"
	mv "$tmp/opensearch-$version" "$home"
	rm -rf "$tmp"
}

# render_config writes the node's config directory: loopback, one node,
# no disk watermarks (a full /tmp must not turn the test indexes
# read-only), a bool clause limit that fits search.max_windows windows.
render_config() {
	local conf=$dir/config
	mkdir -p "$conf" "$dir/data" "$dir/logs" "$dir/tmp"
	cp "$home/config/log4j2.properties" "$conf/"
	sed -e "s/^-Xms.*/-Xms$heap/" -e "s/^-Xmx.*/-Xmx$heap/" \
		-e "s|^-XX:HeapDumpPath=.*|-XX:HeapDumpPath=$dir/logs|" \
		-e "s|^-XX:ErrorFile=.*|-XX:ErrorFile=$dir/logs/hs_err_pid%p.log|" \
		-e "s|file=logs/gc.log|file=$dir/logs/gc.log|" \
		"$home/config/jvm.options" >"$conf/jvm.options"
	mkdir -p "$conf/jvm.options.d"
	cat >"$conf/opensearch.yml" <<EOF
cluster.name: parley-test
node.name: parley-test-1
path.data: $dir/data
path.logs: $dir/logs
network.host: 127.0.0.1
http.port: $port
transport.port: $transport_port
discovery.type: single-node
cluster.routing.allocation.disk.threshold_enabled: false
indices.query.bool.max_clause_count: 65536
action.auto_create_index: false
EOF
}

running() {
	[[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

port_busy() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

ready() {
	[[ "$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$url/_cluster/health?wait_for_status=green&timeout=2s")" == 200 ]]
}

announce() { set_env "$engines/env" PARLEY_TEST_OPENSEARCH "$url"; }

start() {
	mkdir -p "$dir"
	if running; then
		local t=$SECONDS
		until ready; do
			((SECONDS - t > start_timeout)) && die "running (pid $(cat "$pidfile")) but not green; logs in $dir/logs"
			sleep 1
		done
		announce
		return
	fi
	for p in "$port" "$transport_port"; do
		port_busy "$p" && die "port $p is taken by another process"
	done
	local t0=$SECONDS
	install_java
	install_dist
	unpack
	render_config
	local run_as=()
	if ((EUID == 0)); then
		chown -R nobody:nogroup "$dir"
		run_as=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
	fi
	log "installed in $((SECONDS - t0))s; starting OpenSearch $version on $url (data $dir)"
	(
		cd "$home"
		exec setsid "${run_as[@]}" env HOME="$dir" OPENSEARCH_JAVA_HOME="$java_home" \
			OPENSEARCH_PATH_CONF="$dir/config" OPENSEARCH_TMPDIR="$dir/tmp" \
			"$home/bin/opensearch" </dev/null >"$dir/stdout.log" 2>&1
	) &
	echo $! >"$pidfile"
	local t1=$SECONDS
	until ready; do
		if ! running; then
			grep -m 5 -E 'ERROR|Exception' "$dir/stdout.log" >&2 || tail -n 20 "$dir/stdout.log" >&2 || true
			rm -f "$pidfile"
			die "OpenSearch exited during startup; logs in $dir/logs and $dir/stdout.log"
		fi
		if ((SECONDS - t1 > start_timeout)); then
			die "not green after ${start_timeout}s; logs in $dir/logs"
		fi
		sleep 1
	done
	log "ready in $((SECONDS - t1))s (total $((SECONDS - t0))s)"
	announce
}

stop() { stop_pidfile "$pidfile" 30; }

status() {
	if running && ready; then
		echo "export PARLEY_TEST_OPENSEARCH=$url"
		return 0
	fi
	log "not running or not green"
	return 1
}

run_action "$@"
