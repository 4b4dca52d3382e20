package cassandra

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/store"
)

// benchStore returns a Store on an emptied test keyspace with convs
// conversations of two members each.
func benchStore(b *testing.B, convs int, lease Lease) *Store {
	b.Helper()
	cfg := fresh(b)
	cfg.SeqBlock, cfg.BucketWidth = 0, 0 // production defaults
	cfg.Lease = lease
	s := openT(b, cfg)
	members := []store.Member{{UserID: "user0"}, {UserID: "user1"}}
	for c := 1; c <= convs; c++ {
		if err := s.CreateConversation(context.Background(), store.Conversation{ID: uint64(c), Kind: store.Group}, members); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// BenchmarkAppend measures appends with a client_msg_id from one process,
// transactional (lwt: idempotency record, body, seq claim: two lightweight
// transactions) and owned (owned: the conversation's partition leased in
// Redis — $PARLEY_TEST_REDIS, else skipped — seqs in memory, plain batched
// writes, one Redis check per batch). One conversation's appends take
// their seqs one after another (lwt) or share batches (owned); across
// conversations they run in parallel.
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []string{"lwt", "owned"} {
		for _, bc := range []struct {
			name    string
			senders int // goroutines per GOMAXPROCS; 0: one sender
			convs   int
		}{
			{"serial", 0, 1},
			{"one-conv-16-senders", 8, 1},
			{"64-convs-64-senders", 32, 64},
		} {
			b.Run(mode+"/"+bc.name, func(b *testing.B) { benchAppend(b, mode, bc.senders, bc.convs) })
		}
	}
}

func benchAppend(b *testing.B, mode string, senders, convs int) {
	var lease Lease
	if mode == "owned" {
		lease = benchLease(b)
	}
	ctx := context.Background()
	s := benchStore(b, convs, lease)
	var ids atomic.Uint64
	appendOne := func() {
		id := ids.Add(1)
		m := store.Message{
			ConvID: id%uint64(convs) + 1, MsgID: id, Sender: "user0", SenderDevice: "d",
			ClientMsgID: fmt.Sprintf("c%d", id), Kind: "text", Body: "hello, this is a benchmark message",
			ServerTime: time.Now().UnixMilli(),
		}
		if _, err := s.Append(ctx, store.Append{Msg: m}); err != nil {
			b.Error(err)
		}
	}
	start := time.Now()
	b.ResetTimer()
	if senders == 0 {
		for b.Loop() {
			appendOne()
		}
	} else {
		b.SetParallelism(senders)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				appendOne()
			}
		})
	}
	b.StopTimer()
	b.ReportMetric(float64(ids.Load())/time.Since(start).Seconds(), "appends/s")
}

// benchLease holds every partition of a fresh namespace on the test
// Redis, as a chat process would.
func benchLease(b *testing.B) Lease {
	addr := os.Getenv("PARLEY_TEST_REDIS")
	if addr == "" {
		b.Skip("PARLEY_TEST_REDIS not set")
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr})
	b.Cleanup(func() { _ = rdb.Close() })
	o := lease.NewOwner(lease.NewRedisStore(rdb, fmt.Sprintf("bench_%d", time.Now().UnixNano())), lease.OwnerConfig{Node: "bench", Partitions: 4})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	for len(o.Held()) < o.Partitions() {
		time.Sleep(50 * time.Millisecond)
	}
	return o
}

// BenchmarkLatest50 measures the history read a client does on opening a
// conversation: Latest(50) of a conversation of 300 messages (index probe,
// slot range, one IN query for the bodies), and a page further back.
func BenchmarkLatest50(b *testing.B) {
	const stored = 300
	ctx := context.Background()
	s := benchStore(b, 1, nil)
	for id := uint64(1); id <= stored; id++ {
		m := store.Message{ConvID: 1, MsgID: id, Sender: "user0", Kind: "text",
			Body: "hello, this is a benchmark message", ServerTime: time.Now().UnixMilli()}
		if _, err := s.Append(ctx, store.Append{Msg: m}); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name   string
		before uint64
	}{{"latest", 0}, {"page-before-200", 200}} {
		b.Run(bc.name, func(b *testing.B) {
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				msgs, err := s.Latest(ctx, 1, bc.before, 0, 50)
				lat = append(lat, time.Since(t0))
				if err != nil || len(msgs) != 50 {
					b.Fatalf("Latest = %d messages, %v; want 50", len(msgs), err)
				}
			}
			slices.Sort(lat)
			ms := func(q float64) float64 {
				return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000
			}
			b.ReportMetric(ms(0.50), "p50-ms")
			b.ReportMetric(ms(0.99), "p99-ms")
		})
	}
}

// BenchmarkDirect measures opening direct conversations from 16
// goroutines per GOMAXPROCS, new pairs (create) and pairs opened before
// (reopen): transactional (lwt: the pair claimed by a lightweight
// transaction, as the owned mode also did before open_direct went to the
// pair's owner) and on the pair's owner (owned: plain writes fenced by the
// epoch and one Redis check; $PARLEY_TEST_REDIS, else skipped). It reports
// opens/s, the latency p50 and the Paxos rounds per open.
func BenchmarkDirect(b *testing.B) {
	for _, mode := range []string{"lwt", "owned"} {
		for _, again := range []bool{false, true} {
			name := mode + "/create"
			if again {
				name = mode + "/reopen"
			}
			b.Run(name, func(b *testing.B) { benchDirect(b, mode, again) })
		}
	}
}

func benchDirect(b *testing.B, mode string, again bool) {
	var lease Lease
	if mode == "owned" {
		lease = benchLease(b)
	}
	ctx := context.Background()
	s := benchStore(b, 0, lease)
	var ids atomic.Uint64
	const reopenPairs = 256
	pairOf := func(n uint64) (string, string) {
		if again {
			n %= reopenPairs
		}
		return fmt.Sprintf("a%d", n), fmt.Sprintf("b%d", n)
	}
	if again {
		for n := range uint64(reopenPairs) {
			x, y := pairOf(n)
			if _, err := s.Direct(ctx, x, y, 1_000_000+n, 1); err != nil {
				b.Fatal(err)
			}
		}
	}
	paxos0 := s.Transactions()
	var mu sync.Mutex
	var lat []time.Duration
	start := time.Now()
	b.ResetTimer()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			n := ids.Add(1)
			x, y := pairOf(n)
			if n%2 == 1 {
				x, y = y, x
			}
			t0 := time.Now()
			if _, err := s.Direct(ctx, x, y, 2_000_000+n, 1); err != nil {
				b.Error(err)
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	n := float64(ids.Load())
	b.ReportMetric(n/time.Since(start).Seconds(), "opens/s")
	b.ReportMetric(float64(s.Transactions()-paxos0)/n, "paxos/open")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
}
