package jetstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"reflect"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/ledger/jetstream"
	"github.com/parley-im/parley/internal/ledger/ledgertest"
)

// natsURL is the NATS server at $PARLEY_TEST_NATS; without it the test
// skips, except in CI, where a missing engine fails.
func natsURL(t *testing.T) string {
	t.Helper()
	url := os.Getenv("PARLEY_TEST_NATS")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires NATS: PARLEY_TEST_NATS is unset")
		}
		t.Skip("PARLEY_TEST_NATS is unset")
	}
	return url
}

func connect(t *testing.T, url string) *natsio.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, err := pnats.Connect(ctx, pnats.ConnConfig{URL: url, Name: t.Name(), ReconnectWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// Each subtest gets streams of its own; reopening connects again, as a
// restarted process would; a crash closes the connection at once.
func TestConformance(t *testing.T) {
	url := natsURL(t)
	ledgertest.Run(t, func(t *testing.T, p ledger.Policy) func() ledgertest.Instance {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		u := "l" + hex.EncodeToString(b)
		cfg := jetstream.Config{Stream: "L_" + u, Subject: u + ".tasks", DeadSubject: u + ".dead", Policy: p}
		t.Cleanup(func() {
			nc := connect(t, url)
			defer nc.Close()
			js, _ := njs.New(nc)
			_ = js.DeleteStream(context.Background(), cfg.Stream)
			_ = js.DeleteStream(context.Background(), cfg.Stream+"_DEAD")
		})
		return func() ledgertest.Instance {
			nc := connect(t, url)
			l, err := jetstream.Open(context.Background(), nc, cfg)
			if err != nil {
				nc.Close()
				t.Fatal(err)
			}
			// A crash: the connection drops with the task unanswered,
			// which comes back after Policy.Timeout (AckWait).
			return ledgertest.Instance{Ledger: l, Close: nc.Close, Crash: nc.Close}
		}
	})
}

// TestCopy stores a pending and a dead task copied from another ledger,
// each published twice under its id: Run hands the pending one out once,
// as recorded, and Dead lists the dead one once with its attempts and
// error.
func TestCopy(t *testing.T) {
	url := natsURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	u := "l" + hex.EncodeToString(b)
	cfg := jetstream.Config{Stream: "L_" + u, Subject: u + ".tasks", DeadSubject: u + ".dead"}
	nc := connect(t, url)
	defer nc.Close()
	t.Cleanup(func() {
		js, _ := njs.New(nc)
		_ = js.DeleteStream(context.Background(), cfg.Stream)
		_ = js.DeleteStream(context.Background(), cfg.Stream+"_DEAD")
	})
	l, err := jetstream.Open(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pending := ledger.Task{ID: 7, Kind: ledger.KindPush, Conv: 3, Seq: 9, Users: []string{"bo"}, Node: "n1", Attempts: 4, NextAt: time.Now().Add(time.Hour).UnixMilli()}
	dead := ledger.Task{ID: 2, Kind: ledger.KindRows, Conv: 1, Seq: 4, Users: []string{"ann"}, Mention: true, Attempts: 16, Error: "refused"}
	for range 2 {
		if err := l.Copy(ctx, pending, false, "copy.7"); err != nil {
			t.Fatal(err)
		}
		if err := l.Copy(ctx, dead, true, "copy.2"); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Copy(ctx, ledger.Task{Kind: "nope"}, false, "copy.x"); !errors.Is(err, ledger.ErrKind) {
		t.Errorf("copy of an unknown kind: %v, want ErrKind", err)
	}

	rctx, stop := context.WithCancel(ctx)
	got := make(chan ledger.Task, 4)
	done := make(chan error, 1)
	go func() {
		done <- l.Run(rctx, func(_ context.Context, task ledger.Task) error { got <- task; return nil })
	}()
	select {
	case task := <-got:
		want := pending
		want.ID, want.Attempts, want.NextAt = task.ID, 1, 0
		if !reflect.DeepEqual(task, want) {
			t.Errorf("ran %+v, want %+v", task, want)
		}
	case <-ctx.Done():
		t.Fatal("the copied task never ran")
	}
	select {
	case task := <-got:
		t.Errorf("a second task ran: %+v", task)
	case <-time.After(2 * time.Second):
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ds, err := l.Dead(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ds, []ledger.Task{dead}) {
		t.Errorf("dead %+v, want %+v", ds, []ledger.Task{dead})
	}
}
