//go:build linux

// Command wsmeasure measures the server-side memory cost of an idle WebSocket
// connection for several Go WebSocket stacks (nbio, gorilla, coder).
//
// Modes:
//
//	wsmeasure server  -impl nbio|gorilla|coder -addr 127.0.0.1:PORT -debug 127.0.0.1:PORT
//	wsmeasure clients -url ws://127.0.0.1:PORT/ws -n N -src 127.0.0.2
//	wsmeasure measure -impl X -conns 15000 -procs 3 [-- extra server flags]
//
// measure runs the server and client processes as children, grows the
// clients over stdin, reads the server's VmRSS and its MemStats (debug
// endpoint) at each checkpoint and prints least-squares slopes per connection.
//
// Concurrency: one process per mode; the server's session registry is guarded
// by a mutex; measure kills every child it started (Pdeathsig if it dies).
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wsmeasure server|clients|measure [flags]")
		os.Exit(2)
	}
	modes := map[string]func([]string) error{"server": runServer, "clients": runClients, "measure": runMeasure}
	run, ok := modes[os.Args[1]]
	if !ok {
		run = func([]string) error { return fmt.Errorf("unknown mode %q", os.Args[1]) }
	}
	if err := run(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "wsmeasure:", err)
		os.Exit(1)
	}
}
