#!/usr/bin/env bash
# Starts the distributed engines cluster mode and its tests use — Redis, NATS
# with JetStream, Cassandra, SeaweedFS for attachments on S3, and
# OpenSearch for search — on loopback, the way CI does, and prints the
# variables that point the tests and `parley serve` at them.
#
#   scripts/engines/up.sh          # start (idempotent) and print the exports
#   source "${PARLEY_ENGINES_DIR:-/tmp/parley-engines}/env"
#   scripts/engines/up.sh status   # exit 1 unless all five run
#   scripts/engines/up.sh stop     # stop all five
set -euo pipefail
cd "$(dirname "$0")"
action="${1:-start}"
rc=0
for engine in redis nats cassandra seaweedfs opensearch; do
	"./$engine.sh" "$action" || rc=$?
done
((rc == 0)) || exit "$rc"
if [[ "$action" == start ]]; then
	dir="${PARLEY_ENGINES_DIR:-/tmp/parley-engines}"
	cat "$dir/env"
	# shellcheck disable=SC1091
	source "$dir/env"
	# Attachments in cluster mode go to the S3 server:
	# PARLEY_TEST_S3 is http://ACCESS:SECRET@HOST:PORT/BUCKET.
	s3="${PARLEY_TEST_S3#http://}"
	s3_creds="${s3%%@*}" s3_rest="${s3#*@}"
	# Every line below must work pasted as printed; the two serves and
	# `parley token` share the development key in ./data.
	cat <<MSG

Cluster mode against these engines (search in OpenSearch): one chat and
one gateway process. In each terminal, from the repository root, first
  export PARLEY_CLUSTER_REDIS=$PARLEY_TEST_REDIS PARLEY_CLUSTER_NATS=$PARLEY_TEST_NATS PARLEY_CLUSTER_CASSANDRA_HOSTS=$PARLEY_TEST_CASSANDRA
  export PARLEY_ATTACH_ENGINE=s3 PARLEY_ATTACH_S3_ENDPOINT=${s3_rest%%/*} PARLEY_ATTACH_S3_BUCKET=${s3_rest#*/} PARLEY_ATTACH_S3_ACCESS_KEY=${s3_creds%%:*} PARLEY_ATTACH_S3_SECRET_KEY=${s3_creds#*:}
  export PARLEY_SEARCH_OPENSEARCH_URL=$PARLEY_TEST_OPENSEARCH
then, one line per terminal, in this order:
  go run ./cmd/parley migrate
  go run ./cmd/parley serve --roles chat --listen 127.0.0.1:7481
  go run ./cmd/parley serve --roles gateway --listen 127.0.0.1:7480
  go run ./cmd/parley-chat -token "\$(go run ./cmd/parley token -user alice)"
MSG
fi

