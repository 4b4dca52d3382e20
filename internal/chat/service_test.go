package chat

import (
	"context"
	"testing"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store"
)

// inlineFanout fans each stored message out in the sender's goroutine,
// right after the ACK, so a test sees its effects once the request has
// returned; a failed fan-out leaves the outbox entry, as a worker would.
type inlineFanout struct {
	*fanout.Fanout
	st store.Store
}

func (i inlineFanout) Enqueue(j fanout.Job) {
	ctx := context.Background()
	if i.FanOut(ctx, j) == nil {
		_ = i.st.FanoutDone(ctx, j.Msg.ConvID, []uint64{j.Msg.Seq})
	}
}

// newService is a service of its own Snowflake node on st, its fan-out
// (inline) pushing through reg and b.
func newService(t testing.TB, cfg Config, st store.Store, reg registry.Registry, b bus.Bus, led fanout.Ledger, node uint16) *Service {
	t.Helper()
	fan, err := fanout.New(fanout.Config{}, fanout.Deps{Store: st, Registry: reg, Bus: b, Ledger: led,
		Online: fanout.NewOnline(st), Tiers: cfg.Tiers()})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(cfg, Deps{Store: st, IDs: snowflake.New(node, nil), Fanout: inlineFanout{fan, st}})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
