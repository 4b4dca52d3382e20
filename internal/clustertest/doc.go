// Package clustertest runs Parley in cluster mode as separate processes —
// several gateways and chat processes of the real binary — on the real
// engines named by PARLEY_TEST_REDIS, PARLEY_TEST_NATS and
// PARLEY_TEST_CASSANDRA (scripts/engines/up.sh starts them). Without them
// the tests skip, except under CI=true, where they fail.
package clustertest
