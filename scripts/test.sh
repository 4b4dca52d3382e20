#!/usr/bin/env bash
# The one test command (see README): vet, formatting, race-enabled tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the run covers depends on the machine: the engine suites run only
# where PARLEY_TEST_* name running engines, the Autobahn cases only with
# kosoku, the browser tests only with Chromium, the proxy example only with
# nginx, the alert rules only with
# promtool. The summary at the end (and `scripts/test.sh --summary`, which
# prints it and runs nothing) says which ran and which were skipped.
steps=()    # "name: outcome" of each step, in order
started=$SECONDS
coverage() {
	local v
	for v in PARLEY_TEST_REDIS PARLEY_TEST_NATS PARLEY_TEST_CASSANDRA PARLEY_TEST_S3 PARLEY_TEST_OPENSEARCH; do
		if [[ -n "${!v:-}" ]]; then
			echo "  ran      the suites on ${v#PARLEY_TEST_} ($v=${!v})"
		else
			echo "  SKIPPED  the suites on ${v#PARLEY_TEST_}: $v is unset (scripts/engines/up.sh start, then source its env file)"
		fi
	done
	if [[ -n "${PARLEY_KOSOKU:-}" ]]; then
		echo "  ran      the Autobahn|Testsuite cases (PARLEY_KOSOKU=$PARLEY_KOSOKU)"
	else
		echo "  SKIPPED  the Autobahn|Testsuite cases: PARLEY_KOSOKU is unset (.ci/run installs kosoku)"
	fi
	if [[ -n "${PARLEY_CHROMIUM:-}" ]] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; then
		echo "  ran      the browser tests (web/, real Chromium)"
	else
		echo "  SKIPPED  the browser tests: no Chromium (apt-get install chromium, or set PARLEY_CHROMIUM)"
	fi
	if command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]]; then
		echo "  ran      the reverse-proxy example in a real nginx"
	else
		echo "  SKIPPED  the reverse-proxy example: no nginx (apt-get install nginx-light)"
	fi
	if command -v promtool >/dev/null 2>&1; then
		echo "  ran      the alert rules' checks (promtool)"
	else
		echo "  SKIPPED  the alert rules' checks: no promtool (apt-get install prometheus)"
	fi
	if command -v systemd-analyze >/dev/null 2>&1; then
		echo "  ran      systemd-analyze verify of deploy/systemd/parley.service"
	else
		echo "  SKIPPED  the systemd unit's check: no systemd-analyze"
	fi
	if command -v podman >/dev/null 2>&1 && command -v buildah >/dev/null 2>&1; then
		echo "  ran      the container image build and run (podman, buildah)"
	else
		echo "  SKIPPED  the container image check: no podman or buildah (apt-get install podman buildah busybox-static)"
	fi
	if command -v helm >/dev/null 2>&1 || [[ -x /tmp/parley-tools/helm ]]; then
		echo "  ran      the Helm chart's render and validation (helm, kubernetes-validate)"
	else
		echo "  SKIPPED  the Helm chart's check: no helm (.ci/run builds it into /tmp/parley-tools)"
	fi
	if command -v podman-compose >/dev/null 2>&1 || [[ -x /tmp/parley-deploy-venv/bin/podman-compose ]]; then
		echo "  ran      the compose file's check (podman-compose)"
	else
		echo "  SKIPPED  the compose file's check: no podman-compose (.ci/run installs it into /tmp/parley-deploy-venv)"
	fi
	echo "  not here the TypeScript SDK and web page build (scripts/web.sh, which .ci/run runs)"
}
if [[ "${1:-}" == --summary ]]; then
	echo "== what scripts/test.sh runs on this machine"
	coverage
	exit 0
fi
summary() {
	local rc=$?
	echo
	echo "== test summary ($((SECONDS - started)) s)"
	local s
	for s in "${steps[@]}"; do
		echo "  step     $s"
	done
	coverage
	if ((rc == 0)); then
		echo "== PASS"
	else
		echo "== FAIL (exit status $rc)"
	fi
}
trap summary EXIT
step() { steps+=("$1"); }

go vet ./...
step "go vet ./...: passed"

unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then
	echo "gofmt: these files need formatting (run gofmt -w):" >&2
	echo "$unformatted" >&2
	exit 1
fi
step "gofmt -l: passed"

# The operations kit (deploy/): the Prometheus alert rules must load and
# pass their unit tests (promtool, Debian package prometheus, which .ci/run
# installs), and the systemd unit must verify where systemd-analyze exists.
# What the rules and the dashboard query is checked against a running node
# by deploy/ops_test.go.
if command -v promtool >/dev/null 2>&1; then
	promtool check rules deploy/prometheus/alerts.yml
	(cd deploy/prometheus && promtool test rules alerts_test.yml)
	step "promtool check and test of the alert rules: passed"
elif [[ "${CI:-}" == true ]]; then
	echo "test: promtool not found (Debian package prometheus); the alert rules cannot be checked" >&2
	exit 1
else
	echo "test: promtool not found: alert rules NOT checked (apt-get install prometheus)" >&2
fi
if command -v systemd-analyze >/dev/null 2>&1; then
	unit_dir="$(mktemp -d)"
	# verify wants an executable ExecStart; any will do.
	sed "s#/usr/local/bin/parley#$(command -v true)#" deploy/systemd/parley.service >"$unit_dir/parley.service"
	systemd-analyze verify "$unit_dir/parley.service"
	rm -rf "$unit_dir"
	step "systemd-analyze verify: passed"
fi

# go_test FLAGS... -- PACKAGES...: go test; a package that fails is run
# once more on its own, and the suite fails only if it fails again. The
# machines this runs on are small and shared (2 cores), and a few tests
# that drive many sockets under -race are sensitive to load; a package
# that passes only on its second run is named FLAKY on stderr so that it
# is seen and fixed, never hidden.
go_test() {
	local flags=()
	while [[ $1 != -- ]]; do
		flags+=("$1")
		shift
	done
	shift
	local log rc
	log="$(mktemp)"
	set +e
	go test "${flags[@]}" "$@" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	set -e
	if ((rc == 0)); then
		rm -f "$log"
		step "go test ${flags[*]} $*: passed"
		return 0
	fi
	local failed=()
	mapfile -t failed < <(awk '$1 == "FAIL" && $2 ~ /\// {print $2}' "$log" | sort -u)
	rm -f "$log"
	if ((${#failed[@]} == 0)); then
		return "$rc"
	fi
	echo "test: ${failed[*]} failed; running once more" >&2
	go test "${flags[@]}" "${failed[@]}"
	echo "test: FLAKY: ${failed[*]} failed, then passed when run again (see the first run above)" >&2
	step "go test ${flags[*]} $*: passed, FLAKY: ${failed[*]} passed only when run again"
}

# -timeout: the cluster packages start real processes against real engines;
# on a loaded 2-core machine they outlast go test's default 10 minutes.
go_test -race -count=1 -timeout 30m -- ./...

# Under -race the gateway runs nbio in blocking mode (see docs/decisions.md);
# run the end-to-end tests once more on the event loop itself, with the
# Autobahn|Testsuite cases against the gateway's WebSocket layer
# (TestAutobahn: needs PARLEY_KOSOKU, which .ci/run installs; under CI=true
# it fails without it).
go_test -count=1 -timeout 30m -- ./internal/e2e/ ./internal/gateway/

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
step "interop/libsignal (vet, go test -race): passed"
