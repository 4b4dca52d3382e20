package cassandra

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// benchStore returns a Store on an emptied test keyspace with convs
// conversations of two members each.
func benchStore(b *testing.B, convs int) *Store {
	b.Helper()
	cfg := fresh(b)
	cfg.SeqBlock, cfg.BucketWidth = 0, 0 // production defaults
	s := openT(b, cfg)
	members := []store.Member{{UserID: "user0"}, {UserID: "user1"}}
	for c := 1; c <= convs; c++ {
		if err := s.CreateConversation(context.Background(), store.Conversation{ID: uint64(c), Kind: store.Group}, members); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// BenchmarkAppend measures appends with a client_msg_id (idempotency
// record, body, seq claim: two lightweight transactions) from one process.
// One conversation's appends claim their seqs one after another; across
// conversations they run in parallel.
func BenchmarkAppend(b *testing.B) {
	for _, bc := range []struct {
		name    string
		senders int // goroutines per GOMAXPROCS; 0: one sender
		convs   int
	}{
		{"serial", 0, 1},
		{"one-conv-16-senders", 8, 1},
		{"64-convs-64-senders", 32, 64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			s := benchStore(b, bc.convs)
			var ids atomic.Uint64
			appendOne := func() {
				id := ids.Add(1)
				m := store.Message{
					ConvID: id%uint64(bc.convs) + 1, MsgID: id, Sender: "user0", SenderDevice: "d",
					ClientMsgID: fmt.Sprintf("c%d", id), Kind: "text", Body: "hello, this is a benchmark message",
					ServerTime: time.Now().UnixMilli(),
				}
				if _, err := s.Append(ctx, store.Append{Msg: m}); err != nil {
					b.Error(err)
				}
			}
			start := time.Now()
			b.ResetTimer()
			if bc.senders == 0 {
				for b.Loop() {
					appendOne()
				}
			} else {
				b.SetParallelism(bc.senders)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						appendOne()
					}
				})
			}
			b.StopTimer()
			b.ReportMetric(float64(ids.Load())/time.Since(start).Seconds(), "appends/s")
		})
	}
}

// BenchmarkLatest50 measures the history read a client does on opening a
// conversation: Latest(50) of a conversation of 300 messages (index probe,
// slot range, one IN query for the bodies), and a page further back.
func BenchmarkLatest50(b *testing.B) {
	const stored = 300
	ctx := context.Background()
	s := benchStore(b, 1)
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
