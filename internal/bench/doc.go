// Package bench owns Parley's benchmark tools, the library of the
// parley-bench command: `parley-bench idle` (server RSS per idle
// authenticated connection), `parley-bench send` (durable 1:1 send→ACK
// throughput and send→deliver latency), `parley-bench fanout` (write
// amplification per fan-out tier, checked against the rows each tier
// writes, and delivery to a fully online group) and `parley-bench history`
// (latest-50 reads). They drive a real `parley serve` child process (the
// ServerBinary of their Config), or with -urls an existing cluster, over
// the public wire protocol, so they measure the binary that ships rather
// than an in-process test node. Hidden client modes of the bench's own
// executable (idle-client, fanout-client, storm-client; the ClientBinary)
// run the many connections in separate processes. Nothing of the server's
// imports this package: it is not linked into parley.
//
// The benchmarks are tools that report figures, not pass/fail tests; the
// arithmetic they report with (Fit, Percentile, the /proc and /metrics
// parsers, the delivery counting) is unit-tested.
//
// Concurrency: the Run functions are one-shot calls that own every goroutine
// and child process they start and return only after all of them have
// stopped; child processes are killed on every return path, including
// cancellation of ctx (Ctrl-C).
package bench
