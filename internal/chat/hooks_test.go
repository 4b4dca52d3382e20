package chat

import (
	"context"
	"testing"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

type wantsReached bool

func (w wantsReached) WantsReached() bool                        { return bool(w) }
func (wantsReached) Fanned(context.Context, fanout.Fanned) error { return nil }

// TestNoWebhookCostsNothing: without webhooks (or without an endpoint
// taking recipient.offline) the fan-out collects nothing and allocates
// nothing for them.
func TestNoWebhookCostsNothing(t *testing.T) {
	m := store.Message{ConvID: 1, Seq: 2, Kind: protocol.KindText}
	users := []string{"a", "b"}
	for _, s := range []*Service{{}, {hook: wantsReached(false)}} {
		if n := testing.AllocsPerRun(100, func() {
			rc := s.collectReached(m)
			rc.add(users)
		}); n != 0 {
			t.Fatalf("hook %v: %v allocations per message", s.hook, n)
		}
		if s.collectReached(m) != nil {
			t.Fatal("collecting reached users without a recipient.offline endpoint")
		}
	}
	s := &Service{hook: wantsReached(true)}
	rc := s.collectReached(m)
	rc.add(users)
	if rc == nil || len(rc.users) != 2 {
		t.Fatalf("collected %v", rc)
	}
	m.Kind = protocol.KindSystem
	if s.collectReached(m) != nil {
		t.Fatal("collecting for a system message")
	}
}
