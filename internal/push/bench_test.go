package push

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	hpebble "github.com/parley-im/parley/internal/hooks/pebble"
	"github.com/parley-im/parley/internal/store"
	spebble "github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// TestPusherBenchmark measures the pusher on Pebble (store and queue on
// disk) against a local APNs endpoint (HTTP/2, TLS, in this process):
//
//   - throughput: PARLEY_PUSH_BENCH_N messages, one per conversation (so
//     none collapses), queued with the pusher stopped, then sent: the
//     notifications per second from its start to the last request;
//   - delay: as many messages at PARLEY_PUSH_BENCH_RATE per second with
//     the pusher running, from each message's server time to its
//     request's arrival (push.burst, 250 ms, included).
//
// The throughput line also gives the process's CPU time over that phase
// and the notifications per CPU-second; the delay line the rate the
// messages were sent at (the sends share the core) and the CPU time from
// the first send to the last arrival.
//
// It runs with PARLEY_PUSH_BENCH=1 (docs/benchmarks.md has the command
// and figures); -cpu 1 holds everything to one core.
func TestPusherBenchmark(t *testing.T) {
	if os.Getenv("PARLEY_PUSH_BENCH") == "" {
		t.Skip("set PARLEY_PUSH_BENCH=1 (docs/benchmarks.md)")
	}
	n := envInt("PARLEY_PUSH_BENCH_N", 5000)
	rate := envInt("PARLEY_PUSH_BENCH_RATE", 1000)
	var (
		mu      sync.Mutex
		arrived = map[uint64]time.Time{} // seq·conv key → arrival
	)
	key := func(conv, seq uint64) uint64 { return conv<<20 | seq }
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Conv string `json:"conv_id"`
			Seq  uint64 `json:"seq"`
		}
		if r.ProtoMajor != 2 || json.Unmarshal(body, &p) != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		c, _ := strconv.ParseUint(p.Conv, 10, 64)
		at := time.Now()
		mu.Lock()
		arrived[key(c, p.Seq)] = at
		mu.Unlock()
		w.Header().Set("apns-id", "00000000-0000-4000-8000-000000000001")
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	prov := &providers{t: t, srv: srv, dir: t.TempDir()}
	prov.apnsKey, prov.vapidKey, prov.fcmKey = benchKeys(t)
	cfg := prov.config()
	cfg.FCM, cfg.WebPush = FCMConfig{}, WebPushConfig{}
	cfg.Preview = PreviewSender
	cfg.Burst = DefaultConfig().Burst

	ctx := context.Background()
	st, err := spebble.Open(ctx, spebble.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	q, err := hpebble.Open(hpebble.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, Options{Queue: q, Store: st, Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	convs := make([]store.Conversation, n)
	par(t, n, func(i int) error {
		u := fmt.Sprintf("u%d", i)
		convs[i] = store.Conversation{ID: uint64(i + 1), Kind: store.Direct, CreatedAt: time.Now().UnixMilli()}
		if err := st.CreateConversation(ctx, convs[i], []store.Member{{ConvID: uint64(i + 1), UserID: "sender"}, {ConvID: uint64(i + 1), UserID: u}}); err != nil {
			return err
		}
		_, err := st.PushRegister(ctx, store.PushReg{UserID: u, DeviceID: "phone", Provider: "apns", Token: fmt.Sprintf("%064x", i), Topic: "im.parley.bench", UpdatedAt: 1}, 4)
		return err
	})
	var msgID sync.Map
	send := func(i int) (store.Message, error) {
		id, _ := msgID.LoadOrStore(i, new(int))
		*id.(*int)++
		res, err := st.Append(ctx, store.Append{Rows: true, Msg: store.Message{ConvID: convs[i].ID, MsgID: uint64(i)<<8 | uint64(*id.(*int)), Sender: "sender",
			ClientMsgID: fmt.Sprint(i, "-", *id.(*int)), Kind: protocol.KindText, Body: "hello", ServerTime: time.Now().UnixMilli()}})
		if err != nil {
			return store.Message{}, err
		}
		return res.Msg, p.Fanned(ctx, fanout.Fanned{Msg: res.Msg, Conv: convs[i], Recipients: []string{"sender", fmt.Sprintf("u%d", i)}, AllRecipients: true, Reached: []string{"sender"}})
	}
	// Throughput: n queued, then sent.
	first := make([]store.Message, n)
	par(t, n, func(i int) error { m, err := send(i); first[i] = m; return err })
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start, cpu0 := time.Now(), cpuTime(t)
	go func() { p.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitArrived := func(ms []store.Message) time.Time {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			mu.Lock()
			missing, last := 0, time.Time{}
			for _, m := range ms {
				at, ok := arrived[key(m.ConvID, m.Seq)]
				if !ok {
					missing++
				} else if at.After(last) {
					last = at
				}
			}
			mu.Unlock()
			if missing == 0 {
				return last
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d notifications never arrived", missing, len(ms))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	end := waitArrived(first)
	cpu := (cpuTime(t) - cpu0).Seconds()
	secs := end.Sub(start).Seconds()
	t.Logf("throughput: %d notifications in %.2fs = %.0f/s (GOMAXPROCS %d); process CPU %.2fs = %.0f per CPU-second", n, secs, float64(n)/secs, runtime.GOMAXPROCS(0), cpu, float64(n)/cpu)

	// Delay: n more at rate per second, the pusher running.
	second := make([]store.Message, n)
	sendStart, cpu1 := time.Now(), cpuTime(t)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	// Up to 64 sends in flight, as from many clients: one at a time, each
	// waiting for its syncs, would cap the rate at the disk's.
	var sends sync.WaitGroup
	inFlight := make(chan struct{}, 64)
	errs := make(chan error, 1)
	for i := range n {
		<-tick.C
		inFlight <- struct{}{}
		sends.Go(func() {
			defer func() { <-inFlight }()
			m, err := send(i)
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
			second[i] = m
		})
	}
	sends.Wait()
	tick.Stop()
	sent := time.Since(sendStart).Seconds()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	waitArrived(second)
	cpu = (cpuTime(t) - cpu1).Seconds()
	mu.Lock()
	lags := make([]time.Duration, 0, n)
	for _, m := range second {
		lags = append(lags, arrived[key(m.ConvID, m.Seq)].Sub(time.UnixMilli(m.ServerTime)))
	}
	mu.Unlock()
	slices.Sort(lags)
	q50, q99 := lags[len(lags)/2], lags[len(lags)*99/100]
	// The sends are the benchmark's own, on the same core: a pusher that
	// takes more CPU slows them below rate.
	t.Logf("delay at %d messages/s (sent at %.0f/s; process CPU %.2fs): p50 %v, p99 %v, max %v (push.burst %v included)", rate, float64(n)/sent, cpu,
		q50.Round(time.Millisecond), q99.Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond), cfg.Burst)
	waitFor(t, func() bool { b, d := p.Backlog(); return b == 0 && d == 0 }, "the queue empties after every notification arrived")
}

// cpuTime is the process's CPU time so far (user and system, every
// thread: the pusher, its store and queue, and the provider endpoint).
// On a machine shared with other work the wall-clock rate depends on the
// CPU share the process gets, the rate per CPU-second much less so.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// par runs f(0..n-1) on 64 goroutines.
func par(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	next := make(chan int)
	for range 64 {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}
