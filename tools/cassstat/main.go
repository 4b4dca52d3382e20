// Command cassstat prints, per table of one keyspace, how many reads,
// writes (mutations: a batch's rows of one partition count once, and as
// coordinator) and range scans the Cassandra node served, and the requests
// (a batch counts once) of the client connections using the keyspace
// (Cassandra 4+'s system_views). Run it before and after a
// benchmark and pass the first output's file to -since, with -per the
// messages the benchmark sent, for statements per message:
//
//	go run ./tools/cassstat -keyspace pb1 >/tmp/before
//	... benchmark of N messages ...
//	go run ./tools/cassstat -keyspace pb1 -since /tmp/before -per N
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

func main() {
	hosts := flag.String("hosts", "127.0.0.1:9042", "Cassandra contact points, comma-separated")
	ks := flag.String("keyspace", "", "keyspace whose tables to count")
	since := flag.String("since", "", "an earlier output of this command: print the differences")
	per := flag.Float64("per", 0, "divide the differences by this (messages sent)")
	flag.Parse()
	if err := run(*hosts, *ks, *since, *per); err != nil {
		fmt.Fprintln(os.Stderr, "cassstat:", err)
		os.Exit(1)
	}
}

// views are the per-table counters read: system_views table → label.
var views = [][2]string{
	{"local_read_latency", "read"},
	{"local_write_latency", "write"},
	{"local_scan_latency", "scan"},
	{"coordinator_write_latency", "cwrite"},
}

func run(hosts, ks, since string, per float64) error {
	if ks == "" {
		return fmt.Errorf("-keyspace is required")
	}
	c := gocql.NewCluster(strings.Split(hosts, ",")...)
	s, err := c.CreateSession()
	if err != nil {
		return err
	}
	defer s.Close()
	now := map[string]float64{}
	for _, v := range views {
		it := s.Query(`SELECT table_name, count FROM system_views.`+v[0]+` WHERE keyspace_name = ?`, ks).Iter()
		var table string
		var n int64
		for it.Scan(&table, &n) {
			now[table+" "+v[1]] = float64(n)
		}
		if err := it.Close(); err != nil {
			return fmt.Errorf("%s: %w", v[0], err)
		}
	}
	// Requests (a batch is one) on the connections of the keyspace's
	// sessions: what the clients asked, whoever else uses the node.
	it := s.Query(`SELECT keyspace_name, request_count FROM system_views.clients`).Iter()
	var name string
	var n int64
	for it.Scan(&name, &n) {
		if name == ks {
			now["clients requests"] += float64(n)
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("clients: %w", err)
	}
	if since == "" {
		for k, n := range now {
			fmt.Printf("%s %.0f\n", k, n)
		}
		return nil
	}
	f, err := os.Open(since)
	if err != nil {
		return err
	}
	defer f.Close()
	before := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Fields(sc.Text())
		if len(p) == 3 {
			n, _ := strconv.ParseFloat(p[2], 64)
			before[p[0]+" "+p[1]] = n
		}
	}
	if per <= 0 {
		per = 1
	}
	keys := make([]string, 0, len(now))
	for k := range now {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	total := map[string]float64{}
	for _, k := range keys {
		d := (now[k] - before[k]) / per
		if d == 0 {
			continue
		}
		fmt.Printf("%-40s %8.2f\n", k, d)
		total[strings.Fields(k)[1]] += d
	}
	for _, v := range views {
		fmt.Printf("%-40s %8.2f\n", "total "+v[1], total[v[1]])
	}
	fmt.Printf("%-40s %8.2f\n", "total requests", total["requests"])
	return nil
}
