package jetstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
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
