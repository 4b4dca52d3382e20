//go:build linux

// Command cassfloor measures what single CQL statements cost a Cassandra
// node: for each statement kind it runs -workers concurrent loops for
// -duration and prints statements per second, the latency percentiles and,
// with -pid (the Cassandra JVM's process id), the node's CPU time per
// statement (utime + stime from /proc, minus what the node spent in an
// equally long idle window measured first, so background work — other
// clients, compaction — is not counted). It is the floor under the chat
// tier's cost per message: an append is a few of these statements.
//
//	go run ./tools/cassfloor -hosts 127.0.0.1:9042 -pid $(pgrep -f CassandraDaemon) -workers 16 -duration 5s
//
// It creates and drops a private keyspace (cassfloor_<random>).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cassfloor:", err)
		os.Exit(1)
	}
}

type kind struct {
	name string
	desc string
	// op runs one statement (or batch) with a fresh key i.
	op func(ctx context.Context, s *gocql.Session, i int64) error
}

func kinds() []kind {
	body := strings.Repeat("x", 100)
	return []kind{
		{"insert", "one-row INSERT (a message body)", func(ctx context.Context, s *gocql.Session, i int64) error {
			return s.Query(`INSERT INTO t1 (k, c, v) VALUES (?, ?, ?)`, i%1000, i, body).WithContext(ctx).Exec()
		}},
		{"read", "one-row SELECT by key (a membership)", func(ctx context.Context, s *gocql.Session, i int64) error {
			var v string
			err := s.Query(`SELECT v FROM t1 WHERE k = ? AND c = ?`, i%1000, i%5000).WithContext(ctx).Scan(&v)
			if err == gocql.ErrNotFound {
				err = nil
			}
			return err
		}},
		{"unlogged-1p-4", "UNLOGGED batch of 4 rows of one partition", func(ctx context.Context, s *gocql.Session, i int64) error {
			b := s.Batch(gocql.UnloggedBatch).WithContext(ctx)
			for j := range int64(4) {
				b.Query(`INSERT INTO t1 (k, c, v) VALUES (?, ?, ?)`, i%1000, i*4+j, body)
			}
			return b.Exec()
		}},
		{"unlogged-4p", "UNLOGGED batch of 4 rows in 4 partitions (2 tables)", func(ctx context.Context, s *gocql.Session, i int64) error {
			b := s.Batch(gocql.UnloggedBatch).WithContext(ctx)
			b.Query(`INSERT INTO t1 (k, c, v) VALUES (?, ?, ?)`, i%1000, i, body)
			b.Query(`INSERT INTO t1 (k, c, v) VALUES (?, ?, ?)`, 1000+i%1000, i, body)
			b.Query(`INSERT INTO t2 (k, v) VALUES (?, ?)`, i, i)
			b.Query(`INSERT INTO t2 (k, v) VALUES (?, ?)`, -i, i)
			return b.Exec()
		}},
		{"logged-2p", "LOGGED batch of 2 rows in 2 tables (slot + idempotency)", func(ctx context.Context, s *gocql.Session, i int64) error {
			b := s.Batch(gocql.LoggedBatch).WithContext(ctx)
			b.Query(`INSERT INTO t1 (k, c, v) VALUES (?, ?, ?)`, i%1000, i, body)
			b.Query(`INSERT INTO t2 (k, v) VALUES (?, ?)`, i, i)
			return b.Exec()
		}},
		{"lwt", "INSERT ... IF NOT EXISTS (Paxos)", func(ctx context.Context, s *gocql.Session, i int64) error {
			_, err := s.Query(`INSERT INTO t2 (k, v) VALUES (?, ?) IF NOT EXISTS`, i, i).WithContext(ctx).MapScanCAS(map[string]any{})
			return err
		}},
	}
}

func run() error {
	hosts := flag.String("hosts", os.Getenv("PARLEY_TEST_CASSANDRA"), "contact points, comma-separated")
	pid := flag.Int("pid", 0, "the Cassandra process id, for its CPU time per statement (0: not measured)")
	workers := flag.Int("workers", 16, "concurrent statement loops")
	dur := flag.Duration("duration", 5*time.Second, "time per statement kind")
	only := flag.String("only", "", "comma-separated kinds to run (default: all)")
	conns := flag.Int("conns", 2, "connections per host (gocql NumConns)")
	coalesce := flag.Duration("coalesce", 200*time.Microsecond, "gocql WriteCoalesceWaitTime (0: every frame written at once)")
	flag.Parse()
	if *hosts == "" {
		return fmt.Errorf("-hosts or $PARLEY_TEST_CASSANDRA required")
	}
	ks := fmt.Sprintf("cassfloor_%d", rand.Int64N(1e9))
	cl := gocql.NewCluster(strings.Split(*hosts, ",")...)
	cl.Timeout = 10 * time.Second
	cl.NumConns = *conns
	cl.WriteCoalesceWaitTime = *coalesce
	cl.Consistency = gocql.Quorum
	admin, err := cl.CreateSession()
	if err != nil {
		return err
	}
	defer admin.Close()
	for _, stmt := range []string{
		`CREATE KEYSPACE ` + ks + ` WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}`,
		`CREATE TABLE ` + ks + `.t1 (k bigint, c bigint, v text, PRIMARY KEY (k, c))`,
		`CREATE TABLE ` + ks + `.t2 (k bigint PRIMARY KEY, v bigint)`,
	} {
		if err := admin.Query(stmt).Exec(); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	defer func() { _ = admin.Query(`DROP KEYSPACE ` + ks).Exec() }()
	cl.Keyspace = ks
	sess, err := cl.CreateSession()
	if err != nil {
		return err
	}
	defer sess.Close()

	idle := 0.0 // the node's CPU ms per second when this tool is idle
	if *pid != 0 {
		c0 := cpuMS(*pid)
		time.Sleep(*dur)
		idle = (cpuMS(*pid) - c0) / dur.Seconds()
		fmt.Printf("node CPU while idle: %.0f ms/s (subtracted below)\n", idle)
	}
	fmt.Printf("%d workers, %s per kind, NumConns %d, WriteCoalesceWaitTime %s\n\n", *workers, *dur, *conns, *coalesce)
	fmt.Println("| statement | per s | p50 | p99 | node CPU per statement |")
	fmt.Println("|---|---:|---:|---:|---:|")
	var seq atomic.Int64
	for _, k := range kinds() {
		if *only != "" && !slices.Contains(strings.Split(*only, ","), k.name) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), *dur)
		var (
			mu   sync.Mutex
			lat  []time.Duration
			errs atomic.Int64
			wg   sync.WaitGroup
		)
		c0 := 0.0
		if *pid != 0 {
			c0 = cpuMS(*pid)
		}
		t0 := time.Now()
		for range *workers {
			wg.Go(func() {
				var mine []time.Duration
				for ctx.Err() == nil {
					s := time.Now()
					if err := k.op(ctx, sess, seq.Add(1)); err != nil {
						if ctx.Err() == nil {
							errs.Add(1)
						}
						continue
					}
					mine = append(mine, time.Since(s))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		el := time.Since(t0)
		cancel()
		cpu := "—"
		if *pid != 0 && len(lat) > 0 {
			used := cpuMS(*pid) - c0 - idle*el.Seconds()
			cpu = fmt.Sprintf("%.0f µs", used*1000/float64(len(lat)))
		}
		slices.Sort(lat)
		pct := func(q float64) string {
			if len(lat) == 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f ms", float64(lat[int(q*float64(len(lat)-1))].Microseconds())/1000)
		}
		fmt.Printf("| %s: %s | %.0f | %s | %s | %s |", k.name, k.desc, float64(len(lat))/el.Seconds(), pct(0.5), pct(0.99), cpu)
		if n := errs.Load(); n > 0 {
			fmt.Printf(" (%d errors)", n)
		}
		fmt.Println()
	}
	return nil
}

// cpuMS returns the user + system CPU time of process pid in ms.
func cpuMS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) * 1000 / 100 // USER_HZ is 100 on Linux
}
