// Package jetstream is the compensation ledger of cluster mode
// (ledger.Ledger) on a JetStream work queue shared by every chat process.
// Ledger is safe for concurrent use; Run owns its consumers and returns
// when they have stopped.
package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/ledger"
)

// Ledger keeps compensation tasks in a JetStream work queue: durable,
// shared by every chat process, retried with backoff until a handler
// succeeds (cluster mode).
type Ledger struct {
	tasks   *pnats.Tasks
	backlog atomic.Int64
}

var _ ledger.Ledger = (*Ledger)(nil)

// New wraps a task queue.
func New(t *pnats.Tasks) *Ledger { return &Ledger{tasks: t} }

// Record enqueues t.
func (l *Ledger) Record(ctx context.Context, t ledger.Task) error {
	data, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("ledger: jetstream: %w", err)
	}
	return l.tasks.Enqueue(ctx, t.Kind, data)
}

// Run consumes every task kind until ctx ends.
func (l *Ledger) Run(ctx context.Context, h ledger.Handler) error {
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, kind := range []string{ledger.KindRows, ledger.KindPush} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- l.tasks.Consume(ctx, kind, func(ctx context.Context, payload []byte) error {
				var t ledger.Task
				if err := json.Unmarshal(payload, &t); err != nil {
					return nil // undecodable: retrying cannot help
				}
				return h(ctx, t)
			})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			if n, err := l.tasks.Pending(ctx); err == nil {
				l.backlog.Store(int64(n))
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Backlog is the queue's depth as last polled (every 2 s).
func (l *Ledger) Backlog() int { return int(l.backlog.Load()) }
