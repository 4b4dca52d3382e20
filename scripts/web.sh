#!/usr/bin/env bash
# The TypeScript SDK and the web page: install the pinned npm packages,
# generate the frame types (sdk/ts/src/frames.ts, not committed) from
# protocol/schema/frames.json, compile the SDK and the page, fail when the
# committed page build (web/static) is stale, then run the SDK's tests
# (node --test) against a real `parley serve` they build and start
# themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "web: node and npm are required (CI installs them in .ci/run)" >&2
	exit 1
fi
echo "node $(node --version), npm $(npm --version)"

before="$(mktemp -d)"
trap 'rm -rf "$before"' EXIT
cp -r web/static "$before/static"
rm -rf web/static/js # a file the sources no longer produce counts as stale too

(cd sdk/ts && npm ci --no-audit --no-fund && npm run build)

if ! diff -r "$before/static" web/static >&2; then
	echo "web: the committed page build (web/static) is stale; run 'npm run build' in sdk/ts and commit web/static" >&2
	exit 1
fi

# The tests start this binary (built once for both test files).
PARLEY_BIN="$before/parley"
export PARLEY_BIN
go build -o "$PARLEY_BIN" ./cmd/parley
(cd sdk/ts && npm test)
