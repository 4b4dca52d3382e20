package hooks

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/webhook"
)

// BenchmarkProduceDeliver: events of 200 conversations produced by 16
// goroutines (as the 16 fan-out workers do; each Fanned is one fsync,
// which concurrent callers share) and delivered to a receiver that answers
// at once; reports the time per event to produce and to deliver all.
func BenchmarkProduceDeliver(b *testing.B) {
	t := &testing.T{}
	r := newReceiver(t, func(webhook.Event, int) int { return http.StatusOK })
	defer r.srv.Close()
	cfg := testConfig(r.srv.URL)
	cfg.Endpoints[0].Events = []string{webhook.MessageCreated}
	h, err := New(cfg, Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; h.Close() }()
	const convs = 200
	b.ResetTimer()
	start := time.Now()
	const workers = 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < b.N; i += workers {
				c := uint64(i%convs) + 1
				s := uint64(i/convs) + 1
				if err := h.Fanned(ctx, fanout.Fanned{Msg: textMsg(c, s, "alice", "x"), Conv: store.Conversation{ID: c, Kind: store.Group}}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	produced := time.Since(start)
	for h.Stats()[0].Delivered < int64(b.N) {
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(produced.Nanoseconds())/float64(b.N), "ns-produce/event")
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns-total/event")
}
