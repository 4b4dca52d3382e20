package fanout

import (
	"context"
	"math/bits"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/store"
)

// latHist is a log-linear histogram of durations in ns: 8 buckets per
// power of two (≤ 12.5 % error).
type latHist [64 * 8]uint64

func latBucket(ns int64) int {
	if ns < 8 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 1 // ≥ 3
	return e*8 + int(uint64(ns)>>(e-3)&7)
}

// latValue is the lower bound of bucket i.
func latValue(i int) int64 {
	if i < 8 {
		return int64(i)
	}
	e := i / 8
	return int64(1)<<e | int64(i%8)<<(e-3)
}

func (h *latHist) add(o *latHist) {
	for i := range h {
		h[i] += o[i]
	}
}

// quantile returns the bucket of the q-th fraction of the samples.
func (h *latHist) quantile(q float64) int64 {
	var n uint64
	for _, c := range h {
		n += c
	}
	want := uint64(q * float64(n))
	var seen uint64
	for i, c := range h {
		seen += c
		if c > 0 && seen >= want {
			return latValue(i)
		}
	}
	return 0
}

func (h *latHist) max() int64 {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i] > 0 {
			return latValue(i)
		}
	}
	return 0
}

func benchMembers(conv uint64, prefix string, n int) []store.Member {
	ms := make([]store.Member, n)
	for i := range ms {
		ms[i] = store.Member{ConvID: conv, UserID: prefix + strconv.Itoa(i), JoinSeq: uint64(i + 1)}
	}
	return ms
}

// BenchmarkRosterGroupOnline: the send path's GroupOnline of a tracked
// 1,000-member group (200 online), called from parallel goroutines while
// one goroutine keeps the roster busy:
//   - idle: nothing else;
//   - track: Track then Untrack of a 50,000-member group, over and over
//     (as a chat process tracking a large group it now owns);
//   - everyone: the directory's "read everyone again" (after a NATS
//     reconnect or dropped hints) over the 50,000 members of a tracked
//     group, each time until Run has read them all back.
//
// ns/op is the senders' throughput (the histogram's clock reads
// included); p50-ns, p99-ns, p999-ns and max-ns are per call (on a
// loaded machine the tail is mostly the OS descheduling a sender, see
// idle); lockwait-ns/op is the time goroutines spent blocked on locks
// (runtime/metrics /sync/mutex/wait/total, every lock of the process:
// mostly senders waiting for the roster's) per call. A sender that waits
// for a lock held for milliseconds makes one slow call, so the per-call
// quantiles hide it; the lock wait and the throughput do not.
func BenchmarkRosterGroupOnline(b *testing.B) {
	const (
		sendConv = 1
		bigConv  = 2
		bigSize  = 50000
	)
	for _, mode := range []string{"idle", "track", "everyone"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			dir := presence.NewLocal(time.Hour, nil)
			send := benchMembers(sendConv, "s", 1000)
			for _, m := range send[:200] {
				dir.Changed(ctx, m.UserID, true)
			}
			big := benchMembers(bigConv, "g", bigSize)
			for i := 0; i < bigSize; i += 2 {
				dir.Changed(ctx, big[i].UserID, true)
			}
			r := NewRoster(dir, nil)
			rctx, cancel := context.WithCancel(ctx)
			ran := make(chan struct{})
			go func() { defer close(ran); r.Run(rctx) }()
			defer func() { cancel(); <-ran }()
			r.Track(sendConv, send)
			if ms, ok := r.GroupOnline(sendConv); !ok || len(ms) != 200 {
				b.Fatalf("send group: %d online (tracked %v), want 200", len(ms), ok)
			}
			if mode == "everyone" {
				r.Track(bigConv, big)
			}
			drained := func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return len(r.dirty) == 0
			}

			stop := make(chan struct{})
			busy := make(chan int)
			go func() {
				n := 0
				defer func() { busy <- n }()
				for {
					select {
					case <-stop:
						return
					default:
					}
					switch mode {
					case "idle":
						return
					case "track":
						r.Track(bigConv, big)
						r.Untrack(bigConv)
					case "everyone":
						r.notify(presence.Everyone, nil)
						for !drained() {
							select {
							case <-stop:
								return
							case <-time.After(time.Millisecond):
							}
						}
					}
					n++
				}
			}()

			var mu sync.Mutex
			var all latHist
			wait := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
			metrics.Read(wait)
			wait0 := wait[0].Value.Float64()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var h latHist
				for pb.Next() {
					t0 := time.Now()
					ms, ok := r.GroupOnline(sendConv)
					d := time.Since(t0)
					if !ok || len(ms) != 200 {
						panic("send group changed")
					}
					h[latBucket(int64(d))]++
				}
				mu.Lock()
				all.add(&h)
				mu.Unlock()
			})
			b.StopTimer()
			metrics.Read(wait)
			waited := wait[0].Value.Float64() - wait0
			close(stop)
			rounds := <-busy
			b.ReportMetric(float64(all.quantile(0.5)), "p50-ns")
			b.ReportMetric(float64(all.quantile(0.99)), "p99-ns")
			b.ReportMetric(float64(all.quantile(0.999)), "p999-ns")
			b.ReportMetric(float64(all.max()), "max-ns")
			b.ReportMetric(float64(rounds), "busy-rounds")
			b.ReportMetric(waited*1e9/float64(b.N), "lockwait-ns/op")
		})
	}
}
