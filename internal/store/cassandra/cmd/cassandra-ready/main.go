// Command cassandra-ready waits until a Cassandra node answers CQL and
// reports its bootstrap COMPLETED, so scripts/engines/cassandra.sh needs no
// cqlsh (Python) to know when the node can take the test suites.
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
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := wait(ctx, *addr); err != nil {
		fmt.Fprintf(os.Stderr, "cassandra-ready: %s: %v\n", *addr, err)
		os.Exit(1)
	}
}

// wait polls until bootstrapped = COMPLETED or ctx ends, and returns the
// last failure then.
func wait(ctx context.Context, addr string) error {
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
		state, err := bootstrapped(ctx, host, port)
		switch {
		case err != nil:
			last = err
		case state == "COMPLETED":
			return nil
		default:
			last = fmt.Errorf("bootstrapped = %q", state)
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func bootstrapped(ctx context.Context, host string, port int) (string, error) {
	cluster := gocql.NewCluster(host)
	cluster.Port = port
	cluster.Timeout = 3 * time.Second
	cluster.ConnectTimeout = 3 * time.Second
	cluster.NumConns = 1
	cluster.Consistency = gocql.One
	cluster.DisableInitialHostLookup = true
	s, err := cluster.CreateSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	var state string
	err = s.Query(`SELECT bootstrapped FROM system.local WHERE key = 'local'`).ScanContext(ctx, &state)
	return state, err
}
