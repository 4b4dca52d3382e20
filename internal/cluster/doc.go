// Package cluster connects Parley's roles when they run as separate
// processes: gateways reach the chat tier through NATS request/reply
// (Remote, Serve), presence changes travel between nodes (Relay), and
// compensation tasks live in a JetStream stream (Ledger).
//
// All types are safe for concurrent use; each goroutine they start is
// owned by the value and stopped by its Close or by the context given.
package cluster
