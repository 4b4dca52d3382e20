// Package jetstream is the compensation ledger of cluster mode
// (ledger.Ledger) on a JetStream work queue shared by every chat process:
// a stream of pending tasks, one durable consumer per task kind, and a
// dead stream. The queue itself (tasks.go) is at-least-once with backoff
// and dead letters and knows nothing of ledger tasks. It follows
// ledger.Policy like the Pebble engine (internal/ledger/pebble) and passes
// the same conformance suite (internal/ledger/ledgertest). Ledger is safe
// for concurrent use; Run owns its consumers and returns when they have
// stopped.
package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/ledger"
)

// Config of a JetStream ledger.
type Config struct {
	// Stream, Subject and DeadSubject name the streams (see
	// queueConfig); the dead stream is Stream+"_DEAD".
	Stream, Subject, DeadSubject string
	// Replicas of both streams (default 1).
	Replicas int
	Policy   ledger.Policy
	Logger   *slog.Logger
}

// Ledger keeps compensation tasks in a JetStream work queue: durable,
// shared by every chat process, retried with backoff until a handler
// succeeds or the task is dead.
type Ledger struct {
	tasks   *taskQueue
	backlog atomic.Int64
}

var _ ledger.Ledger = (*Ledger)(nil)

// Open creates (or updates) the streams on nc, which the caller owns.
func Open(ctx context.Context, nc *natsio.Conn, cfg Config) (*Ledger, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	p := cfg.Policy.WithDefaults()
	tasks, err := openQueue(ctx, nc, queueConfig{
		Stream: cfg.Stream, Subject: cfg.Subject, DeadSubject: cfg.DeadSubject,
		Replicas: cfg.Replicas, Logger: cfg.Logger,
		AckWait: p.Timeout, MaxDeliver: p.MaxAttempts,
		BackoffBase: p.MinBackoff, BackoffMax: p.MaxBackoff,
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: %w", err)
	}
	l := &Ledger{tasks: tasks}
	if n, err := tasks.pending(ctx); err == nil {
		l.backlog.Store(int64(n))
	}
	return l, nil
}

// Record enqueues t.
func (l *Ledger) Record(ctx context.Context, t ledger.Task) error {
	if !ledger.ValidKind(t.Kind) {
		return fmt.Errorf("%w %q", ledger.ErrKind, t.Kind)
	}
	t.ID, t.Attempts, t.NextAt, t.Error = 0, 0, 0, ""
	data, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("ledger: jetstream: %w", err)
	}
	if err := l.tasks.enqueue(ctx, t.Kind, data); err != nil {
		return err
	}
	l.backlog.Add(1) // until the next poll
	return nil
}

// Copy stores t, a task of another ledger (parley migrate --from copies
// an embedded node's), pending or, with dead, among the dead tasks with
// its attempts and error. id names the copy for JetStream's duplicate
// window: a copy published again under the same id within two minutes is
// stored once. A pending task is due at once and its attempts start again
// at 1: this engine counts a task's attempts by its deliveries and keeps
// no due time.
func (l *Ledger) Copy(ctx context.Context, t ledger.Task, dead bool, id string) error {
	if !ledger.ValidKind(t.Kind) {
		return fmt.Errorf("%w %q", ledger.ErrKind, t.Kind)
	}
	src := t
	t.ID, t.Attempts, t.NextAt, t.Error = 0, 0, 0, ""
	data, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("ledger: jetstream: copy: %w", err)
	}
	c := l.tasks.cfg
	m := &natsio.Msg{Subject: c.Subject + "." + t.Kind, Data: data, Header: natsio.Header{}}
	if dead {
		m.Subject = c.DeadSubject + "." + t.Kind
		m.Header.Set(headerError, src.Error)
		m.Header.Set(headerAttempts, strconv.Itoa(src.Attempts))
		m.Header.Set(headerSeq, strconv.FormatUint(src.ID, 10))
	}
	if err := l.tasks.publishOnce(ctx, m, id); err != nil {
		return fmt.Errorf("ledger: jetstream: copy: %w", err)
	}
	if !dead {
		l.backlog.Add(1) // until the next poll
	}
	return nil
}

// decode reads a task's payload: its id is its stream sequence, its
// attempt the delivery's.
func decode(d delivery) (ledger.Task, error) {
	var t ledger.Task
	if err := json.Unmarshal(d.Data, &t); err != nil {
		return t, err
	}
	t.ID, t.Attempts = d.Seq, d.Attempt
	return t, nil
}

// Run consumes every task kind until ctx ends.
func (l *Ledger) Run(ctx context.Context, h ledger.Handler) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(ledger.Kinds))
	for _, kind := range ledger.Kinds {
		wg.Go(func() {
			errs <- l.tasks.consumeDeliveries(ctx, kind, func(ctx context.Context, d delivery) error {
				t, err := decode(d)
				if err != nil {
					return fmt.Errorf("undecodable task: %w: %w", err, errPermanent)
				}
				return h(ctx, t)
			})
		})
	}
	wg.Go(func() {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			if n, err := l.tasks.pending(ctx); err == nil {
				l.backlog.Store(int64(n))
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Backlog is the queue's depth as last polled (every 2 s while Run runs),
// plus the tasks recorded here since.
func (l *Ledger) Backlog() int { return int(l.backlog.Load()) }

// Dead lists at most max dead tasks, oldest first.
func (l *Ledger) Dead(ctx context.Context, max int) ([]ledger.Task, error) {
	ds, err := l.tasks.dead(ctx, max)
	if err != nil {
		return nil, fmt.Errorf("ledger: jetstream: %w", err)
	}
	out := make([]ledger.Task, 0, len(ds))
	for _, d := range ds {
		t, err := decode(delivery{Data: d.Data, Seq: d.Seq, Attempt: d.Attempts})
		if err != nil {
			t = ledger.Task{ID: d.Seq, Kind: d.Kind, Attempts: d.Attempts}
		}
		t.Error = d.Error
		out = append(out, t)
	}
	return out, nil
}
