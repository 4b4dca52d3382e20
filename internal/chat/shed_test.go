package chat

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/protocol"
)

// gateConsumer holds every fanned-out message until opened: a fan-out
// that falls behind its ACKs (a slow consumer, as a slow registry or bus
// would make it).
type gateConsumer struct {
	once sync.Once
	open chan struct{}
	fail bool // fail every fan-out instead (an engine outage: retried with backoff)
}

func (g *gateConsumer) WantsReached() bool { return false }

func (g *gateConsumer) Fanned(ctx context.Context, _ fanout.Fanned) error {
	if g.fail {
		return errors.New("consumer unavailable")
	}
	select {
	case <-g.open:
	case <-ctx.Done():
	}
	return nil
}

func (g *gateConsumer) release() { g.once.Do(func() { close(g.open) }) }

// TestSendShedWhileFanoutBehind: while the fan-out's oldest message has
// waited longer than chat.max_fanout_lag since its ACK, a send is answered
// overloaded with a retry_after_ms and nothing is stored; once the fan-out
// catches up, the same send is stored at the next seq (not a duplicate).
// With the bound at 0 nothing is shed, nor when the fan-out is behind
// because it fails and retries (an engine outage, not load).
func TestSendShedWhileFanoutBehind(t *testing.T) {
	for _, c := range []struct {
		bound time.Duration
		fail  bool
	}{{300 * time.Millisecond, false}, {0, false}, {300 * time.Millisecond, true}} {
		bound := c.bound
		r := newReceiptRig(t)
		gate := &gateConsumer{open: make(chan struct{}), fail: c.fail}
		t.Cleanup(gate.release)
		cfg := DefaultConfig()
		cfg.MaxFanoutLag = bound
		fan, err := fanout.New(fanout.Config{}, fanout.Deps{Store: r.st, Registry: r.reg, Bus: r.b, Ledger: r.led,
			Online: fanout.NewOnline(r.st), Tiers: cfg.Tiers(), Consumers: []fanout.Consumer{gate}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { fan.Run(ctx) })
		t.Cleanup(func() { gate.release(); cancel(); wg.Wait() })
		svc, err := New(cfg, Deps{Store: r.st, IDs: snowflake.New(1, nil), Fanout: fan})
		if err != nil {
			t.Fatal(err)
		}
		conv := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"}).Conv.ConvID
		send := func(id string) *protocol.Frame {
			return r.call(svc, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Kind: protocol.KindText, Body: id})
		}
		if ack := send("m1"); ack == nil || ack.Type != protocol.TypeAck || ack.Seq != 1 {
			t.Fatalf("bound %v: first send answered %+v", bound, ack)
		}
		// m1's fan-out is held: the lag grows past the bound.
		time.Sleep(400 * time.Millisecond)
		if lag := fan.Lag(); lag < 300*time.Millisecond {
			t.Fatalf("bound %v: fan-out lag %v with a message held for 400ms", bound, lag)
		}
		got := send("m2")
		if bound == 0 || c.fail {
			if got == nil || got.Type != protocol.TypeAck || got.Seq != 2 {
				t.Fatalf("bound %v, failing fan-out %v: a send while the fan-out lags answered %+v, want its ACK", bound, c.fail, got)
			}
			if lag := fan.LoadLag(); c.fail && lag != 0 {
				t.Errorf("failing fan-out: load lag %v, want 0 (only retries wait)", lag)
			}
			continue
		}
		if got == nil || got.Type != protocol.TypeError || got.Code != protocol.CodeOverloaded || got.RetryAfter < 100 ||
			!strings.Contains(got.Error, "behind the acknowledgements") {
			t.Fatalf("bound %v: a send while the fan-out lags answered %+v, want overloaded with retry_after_ms", bound, got)
		}
		gate.release()
		deadline := time.Now().Add(5 * time.Second)
		for fan.Lag() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("fan-out lag still %v 5s after the consumer was released", fan.Lag())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if ack := send("m2"); ack == nil || ack.Type != protocol.TypeAck || ack.Seq != 2 || ack.Duplicate {
			t.Fatalf("the shed send retried after the fan-out caught up answered %+v, want a new ACK at seq 2", ack)
		}
	}
}
