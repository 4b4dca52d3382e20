// Package bench owns Parley's benchmark tools: `parley bench idle` (server
// RSS per idle authenticated connection) and `parley bench send` (durable
// 1:1 send→ACK throughput and send→deliver latency). They drive a real
// `parley serve` child process over the public wire protocol, so they measure
// the binary that ships rather than an in-process test node.
//
// The benchmarks are tools that report figures, not pass/fail tests; the
// arithmetic they report with (Fit, Percentile, the /proc and /metrics
// parsers) is unit-tested.
//
// Concurrency: RunIdle, RunIdleClient and RunSend are one-shot calls that own
// every goroutine and child process they start and return only after all of
// them have stopped; child processes are killed on every return path,
// including cancellation of ctx (Ctrl-C).
package bench
