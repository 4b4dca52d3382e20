// Command cassandra-ready waits until a Cassandra node answers CQL and
// reports its bootstrap COMPLETED (and, with -peers N, knows N other nodes
// of its ring), so scripts/engines/cassandra.sh and cassandra-ring.sh need
// no cqlsh (Python) to know when a node can take the test suites.
//
// It exits 0 once the node is ready and 1 when -timeout passes first.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9042", "native transport address host:port")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	peers := flag.Int("peers", 0, "also wait until the node's system.peers_v2 lists this many nodes")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := wait(ctx, *addr, *peers); err != nil {
		fmt.Fprintf(os.Stderr, "cassandra-ready: %s: %v\n", *addr, err)
		os.Exit(1)
	}
}

// wait polls until bootstrapped = COMPLETED with at least peers peers, or
// ctx ends, and returns the last failure then.
func wait(ctx context.Context, addr string, peers int) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("port %q: %w", portStr, err)
	}
	last := errors.New("not polled yet")
	for {
		state, n, err := bootstrapped(ctx, host, port)
		switch {
		case err != nil:
			last = err
		case state != "COMPLETED":
			last = fmt.Errorf("bootstrapped = %q", state)
		case n < peers:
			last = fmt.Errorf("%d peers, want %d", n, peers)
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// bootstrapped returns the node's bootstrap state and how many peers it
// knows.
func bootstrapped(ctx context.Context, host string, port int) (state string, peers int, err error) {
	cluster := gocql.NewCluster(host)
	cluster.Port = port
	cluster.Timeout = 3 * time.Second
	cluster.ConnectTimeout = 3 * time.Second
	cluster.NumConns = 1
	cluster.Consistency = gocql.One
	cluster.DisableInitialHostLookup = true
	s, err := cluster.CreateSession()
	if err != nil {
		return "", 0, err
	}
	defer s.Close()
	if err := s.Query(`SELECT bootstrapped FROM system.local WHERE key = 'local'`).ScanContext(ctx, &state); err != nil {
		return "", 0, err
	}
	err = s.Query(`SELECT count(*) FROM system.peers_v2`).ScanContext(ctx, &peers)
	return state, peers, err
}
