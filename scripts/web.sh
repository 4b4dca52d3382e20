#!/usr/bin/env bash
# The TypeScript SDK and the web page: install the pinned npm packages,
# regenerate the frame types from protocol/schema/frames.json, compile the
# SDK and the page, fail when the committed output (sdk/ts/src/frames.ts,
# web/static/js) is stale, then run the SDK's tests (node --test) against a
# real `parley serve` they build and start themselves.
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
cp sdk/ts/src/frames.ts "$before/frames.ts"
rm -rf web/static/js # a file the sources no longer produce counts as stale too

(cd sdk/ts && npm ci --no-audit --no-fund && npm run build)

if ! diff -r "$before/static" web/static >&2 || ! diff "$before/frames.ts" sdk/ts/src/frames.ts >&2; then
	echo "web: the committed build output (web/static/js, sdk/ts/src/frames.ts) is stale; run 'npm run build' in sdk/ts and commit it" >&2
	exit 1
fi

(cd sdk/ts && npm test)
