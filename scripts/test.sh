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
# run the end-to-end tests once more on the event loop itself, with the
# Autobahn|Testsuite cases against the gateway's WebSocket layer
# (TestAutobahn: needs PARLEY_KOSOKU, which .ci/run installs; under CI=true
# it fails without it).
go test -count=1 ./internal/e2e/ ./internal/gateway/

# End-to-end encryption interoperability against go.mau.fi/libsignal
# (GPL-3.0). It is a module of its own (interop/libsignal) so the GPL code
# never enters Parley's build; check that it did not.
if go list -deps ./... | grep -q '^go.mau.fi/'; then
	echo "test: a go.mau.fi (GPL) package is a dependency of the main module" >&2
	exit 1
fi
# -mod=mod: go.sum may lack lines for requirements the main module added
# since (the replace makes its go.mod part of this module graph).
(cd interop/libsignal && export GOFLAGS=-mod=mod && go vet ./... && go test -race -count=1 ./...)
