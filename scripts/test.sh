#!/usr/bin/env bash
# The one test command (see README): vet, formatting, race-enabled tests.
set -euo pipefail
cd "$(dirname "$0")/.."

go vet ./...

unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then
	echo "gofmt: these files need formatting (run gofmt -w):" >&2
	echo "$unformatted" >&2
	exit 1
fi

go test -race -count=1 ./...

# Under -race the gateway runs nbio in blocking mode (see docs/decisions.md);
# run the end-to-end tests once more on the event loop itself.
go test -count=1 ./internal/e2e/
