package jetstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/enginetest"
)

var ctx = context.Background()

// testURL is the NATS server at $PARLEY_TEST_NATS (scripts/engines/nats.sh).
// Without it the test skips, except in CI, where a missing engine fails.
func testURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset (scripts/engines/nats.sh start)")
		}
		t.Skip("PARLEY_TEST_NATS is unset; run scripts/engines/nats.sh start")
	}
	return url
}

func connect(t testing.TB, url string) *natsio.Conn {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc, err := pnats.Connect(cctx, pnats.ConnConfig{URL: url, Name: t.Name(), ReconnectWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// unique returns a name of the test's own, so tests share one server
// without seeing each other's streams.
func unique() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if f() {
			return
		}
	}
	t.Fatalf("%s: not within 10s", what)
}

// testTasks opens a queue with streams of the test's own, deleted at the end.
func testTasks(t *testing.T, nc *natsio.Conn, cfg queueConfig) *taskQueue {
	t.Helper()
	if cfg.Stream == "" {
		u := unique()
		cfg.Stream, cfg.Subject, cfg.DeadSubject = "T_"+u, u+".tasks", u+".dead"
		t.Cleanup(func() {
			js, _ := jetstream.New(nc)
			if nc.IsConnected() {
				js.DeleteStream(ctx, cfg.Stream)
				js.DeleteStream(ctx, cfg.Stream+"_DEAD")
			}
		})
	}
	q, err := openQueue(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// consume runs q.Consume in the background until the test ends or stop is
// called; stop waits for Consume to return.
func consume(t *testing.T, q *taskQueue, kind string, h func(context.Context, []byte) error) (stop func()) {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- q.consume(cctx, kind, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				// A consumer whose connection was closed under it (a
				// simulated crash) may return an error; others must not.
				if err != nil && !q.js.Conn().IsClosed() {
					t.Errorf("Consume returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Consume did not return within 10s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func streamMsgs(t *testing.T, q *taskQueue, name string) uint64 {
	t.Helper()
	s, err := q.js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func recvPayload(t *testing.T, ch <-chan string, within time.Duration) string {
	t.Helper()
	select {
	case p := <-ch:
		return p
	case <-time.After(within):
		t.Fatalf("no task within %s", within)
	}
	return ""
}

func TestTasksDeliverAndAck(t *testing.T) {
	nc := connect(t, testURL(t))
	q := testTasks(t, nc, queueConfig{})
	for _, p := range []string{"a", "b", "c"} {
		if err := q.enqueue(ctx, "comp", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.enqueue(ctx, "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 8)
	consume(t, q, "comp", func(_ context.Context, p []byte) error { got <- string(p); return nil })
	for _, want := range []string{"a", "b", "c"} {
		if p := recvPayload(t, got, 5*time.Second); p != want {
			t.Fatalf("got %q, want %q (in order)", p, want)
		}
	}
	// Acked tasks leave the work queue; the other kind's task stays.
	eventually(t, "acked tasks removed", func() bool { return streamMsgs(t, q, q.cfg.Stream) == 1 })
	if err := q.enqueue(ctx, "bad.kind", nil); err == nil {
		t.Fatal("Enqueue accepted a kind with a dot")
	}
}

func TestTasksRetryWithBackoff(t *testing.T) {
	nc := connect(t, testURL(t))
	q := testTasks(t, nc, queueConfig{BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
	var mu sync.Mutex
	var at []time.Time
	done := make(chan struct{})
	consume(t, q, "comp", func(context.Context, []byte) error {
		mu.Lock()
		defer mu.Unlock()
		at = append(at, time.Now())
		if len(at) < 3 {
			return errors.New("ledger unavailable")
		}
		close(done)
		return nil
	})
	if err := q.enqueue(ctx, "comp", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("task not retried to success within 10s")
	}
	mu.Lock()
	defer mu.Unlock()
	if g1, g2 := at[1].Sub(at[0]), at[2].Sub(at[1]); g1 < 90*time.Millisecond || g2 < 190*time.Millisecond {
		t.Fatalf("retry gaps %s and %s, want ≥100ms then ≥200ms", g1, g2)
	}
	eventually(t, "task acked", func() bool { return streamMsgs(t, q, q.cfg.Stream) == 0 })
}

func TestTasksDeadAfterMaxDeliver(t *testing.T) {
	nc := connect(t, testURL(t))
	q := testTasks(t, nc, queueConfig{MaxDeliver: 3, BackoffBase: 20 * time.Millisecond})
	calls := make(chan string, 8)
	consume(t, q, "comp", func(_ context.Context, p []byte) error {
		calls <- string(p)
		return errors.New("always fails")
	})
	if err := q.enqueue(ctx, "comp", []byte("doomed")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		recvPayload(t, calls, 5*time.Second)
	}
	eventually(t, "task moved to the dead stream", func() bool {
		return streamMsgs(t, q, q.cfg.Stream+"_DEAD") == 1 && streamMsgs(t, q, q.cfg.Stream) == 0
	})
	select {
	case p := <-calls:
		t.Fatalf("attempt 4 of %q with MaxDeliver 3", p)
	case <-time.After(300 * time.Millisecond):
	}
	s, _ := q.js.Stream(ctx, q.cfg.Stream+"_DEAD")
	m, err := s.GetLastMsgForSubject(ctx, q.cfg.DeadSubject+".comp")
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "doomed" || m.Header.Get("Parley-Error") != "always fails" {
		t.Fatalf("dead task %q with error %q", m.Data, m.Header.Get("Parley-Error"))
	}
}

// A consumer that stops while holding a task hands it back at once.
func TestTasksHandedBackOnStop(t *testing.T) {
	url := testURL(t)
	nc := connect(t, url)
	q := testTasks(t, nc, queueConfig{AckWait: time.Minute})
	entered := make(chan struct{})
	stop := consume(t, q, "comp", func(hctx context.Context, _ []byte) error {
		close(entered)
		<-hctx.Done()
		return hctx.Err()
	})
	if err := q.enqueue(ctx, "comp", []byte("x")); err != nil {
		t.Fatal(err)
	}
	<-entered
	stop()
	// The restarted consumer runs in another process (connection).
	q2 := testTasks(t, connect(t, url), q.cfg)
	got := make(chan string, 1)
	consume(t, q2, "comp", func(_ context.Context, p []byte) error { got <- string(p); return nil })
	if p := recvPayload(t, got, 5*time.Second); p != "x" {
		t.Fatalf("got %q", p)
	}
}

// A consumer that dies with a task (no ack, no nak) loses it only until
// AckWait: then the next consumer gets it.
func TestTasksRedeliveredAfterConsumerCrash(t *testing.T) {
	url := testURL(t)
	crashing := connect(t, url)
	q := testTasks(t, crashing, queueConfig{AckWait: 500 * time.Millisecond})
	q2 := testTasks(t, connect(t, url), q.cfg)
	if err := q.enqueue(ctx, "comp", []byte("x")); err != nil {
		t.Fatal(err)
	}
	taken := make(chan struct{})
	consume(t, q, "comp", func(context.Context, []byte) error {
		crashing.Close() // the process dies mid-task; its ack never leaves
		close(taken)
		return nil
	})
	<-taken
	start := time.Now()
	got := make(chan string, 1)
	consume(t, q2, "comp", func(_ context.Context, p []byte) error { got <- string(p); return nil })
	if p := recvPayload(t, got, 5*time.Second); p != "x" {
		t.Fatalf("got %q", p)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("redelivered after %s, before AckWait could have passed", d)
	}
}

func TestTasksSurviveServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv := enginetest.NATS(t, 0, dir)
	nc := connect(t, srv.ClientURL())
	q := testTasks(t, nc, queueConfig{Stream: "PARLEY_TASKS"})
	if err := q.enqueue(ctx, "comp", []byte("before")); err != nil {
		t.Fatal(err)
	}
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	eventually(t, "client notices the outage", func() bool { return !nc.IsConnected() })
	if err := q.enqueue(ctx, "comp", []byte("lost")); !errors.Is(err, pnats.ErrDisconnected) {
		t.Fatalf("Enqueue during the outage = %v, want pnats.ErrDisconnected", err)
	}
	srv = enginetest.NATS(t, port, dir)
	got := make(chan string, 4)
	consume(t, q, "comp", func(_ context.Context, p []byte) error { got <- string(p); return nil })
	if p := recvPayload(t, got, 10*time.Second); p != "before" {
		t.Fatalf("got %q, want the task stored before the restart", p)
	}
	// Restart again under the running consumer.
	srv = enginetest.RestartNATS(t, srv, dir)
	eventually(t, "Enqueue after the restart", func() bool {
		return q.enqueue(ctx, "comp", []byte("after")) == nil
	})
	if p := recvPayload(t, got, 10*time.Second); p != "after" {
		t.Fatalf("got %q, want after", p)
	}
}

func TestQueueConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"defaults", (&queueConfig{}).Validate()},
		{"same subjects", (&queueConfig{Subject: "x", DeadSubject: "x"}).Validate()},
		{"bad stream", (&queueConfig{Stream: "a.b"}).Validate()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantOK := tc.name == "defaults"
			if (tc.err == nil) != wantOK {
				t.Fatalf("Validate() = %v, want ok=%v", tc.err, wantOK)
			}
		})
	}
}
