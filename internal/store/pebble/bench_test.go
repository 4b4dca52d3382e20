package pebble

import (
	"context"
	"fmt"
	"path/filepath"
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
		name        string
		senders     int // goroutines per GOMAXPROCS
		convs       int
		fanOutUsers int
	}{
		{"serial", 0, 1, 2},
		{"one-conv-64-senders", 32, 1, 2},
		{"64-convs-64-senders", 32, 64, 2},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			s, err := Open(ctx, Config{Dir: filepath.Join(b.TempDir(), "db")})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			users := make([]string, bc.fanOutUsers)
			members := make([]store.Member, bc.fanOutUsers)
			for i := range users {
				users[i] = fmt.Sprintf("user%d", i)
				members[i] = store.Member{UserID: users[i]}
			}
			for c := 1; c <= bc.convs; c++ {
				if err := s.CreateConversation(ctx, store.Conversation{ID: uint64(c), Kind: store.Group}, members); err != nil {
					b.Fatal(err)
				}
			}
			var ids atomic.Uint64
			appendOne := func() {
				id := ids.Add(1)
				m := store.Message{
					ConvID: id%uint64(bc.convs) + 1, MsgID: id, Sender: "user0", SenderDevice: "d",
					ClientMsgID: fmt.Sprintf("c%d", id), Kind: "text", Body: "hello, this is a benchmark message",
					ServerTime: time.Now().UnixMilli(),
				}
				if _, err := s.Append(ctx, store.Append{Msg: m, Rows: users}); err != nil {
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
