package pebble

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/parley-im/parley/internal/store"
)

// walSyncs is the number of WAL fsyncs so far.
func (s *Store) walSyncs(b *testing.B) uint64 {
	var m dto.Metric
	if err := s.db.Metrics().LogWriter.FsyncLatency.Write(&m); err != nil {
		b.Fatalf("fsync metric: %v", err)
	}
	return m.GetHistogram().GetSampleCount()
}

// BenchmarkAppend measures durable appends on disk with concurrent senders;
// fsyncs/append below 1 is group commit at work.
func BenchmarkAppend(b *testing.B) {
	for _, bc := range []struct {
		name    string
		senders int // goroutines per GOMAXPROCS
		convs   int
	}{
		{"serial", 0, 1},
		{"one-conv-64-senders", 32, 1},
		{"64-convs-64-senders", 32, 64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			s, _ := openBench(b, bc.convs, 2)
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
			syncs0 := s.walSyncs(b)
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
			n := float64(ids.Load())
			b.ReportMetric(n/time.Since(start).Seconds(), "appends/s")
			b.ReportMetric(float64(s.walSyncs(b)-syncs0)/n, "fsyncs/append")
		})
	}
}

// openBench opens a store on disk with convs groups of the same members.
func openBench(b *testing.B, convs, members int) (*Store, []string) {
	b.Helper()
	s, err := open(context.Background(), Config{Dir: filepath.Join(b.TempDir(), "db")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	users := make([]string, members)
	ms := make([]store.Member, members)
	for i := range users {
		users[i] = fmt.Sprintf("user%d", i)
		ms[i] = store.Member{UserID: users[i]}
	}
	for c := 1; c <= convs; c++ {
		if err := s.CreateConversation(context.Background(), store.Conversation{ID: uint64(c), Kind: store.Group}, ms); err != nil {
			b.Fatal(err)
		}
	}
	return s, users
}

// BenchmarkUpdateRows measures write fan-out: one call raises the rows of a
// 200-member group to a new seq, durably. Calls for different groups share
// fsyncs; calls for one group serialise on its rows lock but for the fsync.
func BenchmarkUpdateRows(b *testing.B) {
	const members = 200
	for _, bc := range []struct {
		name    string
		callers int // goroutines per GOMAXPROCS
		convs   int
	}{
		{"serial", 0, 1},
		{"one-conv-16-callers", 8, 1},
		{"16-convs-16-callers", 8, 16},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			s, users := openBench(b, bc.convs, members)
			// Fan-out follows stored messages: call n raises the rows of
			// conversation n%convs+1 to seq n/convs+1.
			fill(b, s, bc.convs, b.N)
			var calls atomic.Uint64
			update := func() {
				n := calls.Add(1) - 1
				conv, seq := n%uint64(bc.convs)+1, n/uint64(bc.convs)+1
				if err := s.UpdateRows(ctx, conv, seq, users, seq%10 == 0); err != nil {
					b.Error(err)
				}
			}
			syncs0 := s.walSyncs(b)
			start := time.Now()
			b.ResetTimer()
			if bc.callers == 0 {
				for range b.N {
					update()
				}
			} else {
				b.SetParallelism(bc.callers)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						update()
					}
				})
			}
			b.StopTimer()
			n := float64(calls.Load())
			b.ReportMetric(n*members/time.Since(start).Seconds(), "rows/s")
			b.ReportMetric(float64(s.walSyncs(b)-syncs0)/n, "fsyncs/call")
		})
	}
}

// fill appends n messages round-robin to conversations 1..convs, from
// concurrent senders so that group commit keeps the setup short.
func fill(b *testing.B, s *Store, convs, n int) {
	b.Helper()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range 64 {
		wg.Go(func() {
			for k := next.Add(1) - 1; k < int64(n); k = next.Add(1) - 1 {
				m := store.Message{ConvID: uint64(k)%uint64(convs) + 1, MsgID: uint64(k) + 1, Sender: "user0",
					Kind: "text", Body: "fan-out benchmark", ServerTime: time.Now().UnixMilli()}
				if _, err := s.Append(context.Background(), store.Append{Msg: m}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
