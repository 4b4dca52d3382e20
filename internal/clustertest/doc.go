// Package clustertest runs Parley in cluster mode as separate processes —
// several gateways and chat processes of the real binary — on the real
// engines named by PARLEY_TEST_REDIS, PARLEY_TEST_NATS and
// PARLEY_TEST_CASSANDRA (scripts/engines/up.sh starts them). Without them
// the tests skip, except under CI=true, where they fail.
//
// Each test gets its own Cassandra keyspace and NATS/Redis namespace,
// dropped at the end. Tests that restart an engine (Redis, NATS) run the
// cluster on a private server of that engine started on a free port, so the
// shared engines are never disturbed. The acceptance tests check, against
// the stored history, that every acknowledged message is stored exactly once
// with dense seqs and that each client's delivered stream is in order,
// without holes or repeats.
//
// The harness (Cluster, Proc) is used from the test's goroutine; the load
// helpers (senders, SDK watchers) run their own goroutines and are stopped
// and waited for by the test before it checks anything.
package clustertest
