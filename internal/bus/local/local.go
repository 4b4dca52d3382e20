// Package local is the in-process bus used when every role runs in one
// process: Publish calls the node's handler directly. Safe for concurrent
// use; handlers may run concurrently with each other.
package local

import (
	"context"
	"fmt"
	"sync"

	"github.com/parley-im/parley/internal/bus"
)

// Bus is an in-process bus.Bus.
type Bus struct {
	mu struct {
		sync.RWMutex
		subs map[string]*sub
	}
}

type sub struct{ h bus.Handler }

var _ bus.Bus = (*Bus)(nil)

// New returns a bus without subscribers.
func New() *Bus {
	b := &Bus{}
	b.mu.subs = make(map[string]*sub)
	return b
}

func (b *Bus) Publish(_ context.Context, node string, d bus.Delivery) error {
	b.mu.RLock()
	s := b.mu.subs[node]
	b.mu.RUnlock()
	if s == nil {
		return fmt.Errorf("local: publish to %q: %w", node, bus.ErrNoSubscriber)
	}
	if err := s.h(d); err != nil {
		return fmt.Errorf("local: publish to %q: %w", node, err)
	}
	return nil
}

func (b *Bus) Subscribe(_ context.Context, node string, h bus.Handler) (func(), error) {
	s := &sub{h: h}
	b.mu.Lock()
	b.mu.subs[node] = s
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		if b.mu.subs[node] == s {
			delete(b.mu.subs, node)
		}
		b.mu.Unlock()
	}, nil
}
