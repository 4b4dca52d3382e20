// Package ledger is the compensation ledger of group fan-out: when a
// conversation-row write or a push fails after the message is stored, the
// failure is recorded durably as a task (conversation, seq, member range)
// and retried with backoff until it succeeds. The stored message is never
// rolled back; a task only re-applies idempotent work.
//
// Ledger is the seam; this package holds a Pebble-backed engine for the
// embedded mode (a small database of its own next to the store). A
// JetStream-backed engine serves cluster mode. Both are safe for concurrent
// use.
package ledger

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	cpebble "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Task kinds.
const (
	KindRows = "rows" // write fan-out: UpdateRows(conv, seq, users, mention)
	KindPush = "push" // push of a stored message to users on a node
)

// Task is one piece of fan-out work to redo.
type Task struct {
	ID       uint64   `json:"id"`
	Kind     string   `json:"kind"`
	Conv     uint64   `json:"conv"`
	Seq      uint64   `json:"seq"`
	Users    []string `json:"users"`
	Mention  bool     `json:"mention,omitempty"`
	Node     string   `json:"node,omitempty"`
	Attempts int      `json:"attempts"`
	NextAt   int64    `json:"next_at"` // unix ms
}

// Handler redoes a task; an error schedules another attempt.
type Handler func(ctx context.Context, t Task) error

// Ledger records failed fan-out work and retries it.
type Ledger interface {
	Record(ctx context.Context, t Task) error
	Run(ctx context.Context, h Handler) error
	Backlog() int
}

// Config of the Pebble ledger.
type Config struct {
	Dir        string
	FS         vfs.FS // nil: disk
	MinBackoff time.Duration
	MaxBackoff time.Duration
	Poll       time.Duration // how often due tasks are looked for
	Logger     *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Pebble is a durable Ledger in its own Pebble database.
type Pebble struct {
	cfg     Config
	db      *cpebble.DB
	nextID  atomic.Uint64
	backlog atomic.Int64
	wake    chan struct{}
	closeMu sync.Once
}

var _ Ledger = (*Pebble)(nil)

// Open opens (or creates) the ledger at cfg.Dir and counts its backlog.
func Open(cfg Config) (*Pebble, error) {
	cfg = cfg.withDefaults()
	opts := &cpebble.Options{FS: cfg.FS, Logger: pebbleLog{cfg.Logger}}
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	db, err := cpebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	l := &Pebble{cfg: cfg, db: db, wake: make(chan struct{}, 1)}
	it, err := db.NewIter(nil)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	var n int64
	for ok := it.First(); ok; ok = it.Next() {
		n++
		l.nextID.Store(max(l.nextID.Load(), binary.BigEndian.Uint64(it.Key())))
	}
	if err := it.Close(); err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	l.backlog.Store(n)
	return l, nil
}

func key(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// Record stores t durably (fsync) for retry; it is due at once.
func (l *Pebble) Record(_ context.Context, t Task) error {
	t.ID = l.nextID.Add(1)
	t.NextAt = 0
	v, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("ledger: record: %w", err)
	}
	if err := l.db.Set(key(t.ID), v, cpebble.Sync); err != nil {
		return fmt.Errorf("ledger: record: %w", err)
	}
	l.backlog.Add(1)
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// Backlog is the number of tasks not yet completed.
func (l *Pebble) Backlog() int { return int(l.backlog.Load()) }

// Run retries due tasks until ctx ends: a task whose handler succeeds is
// deleted; one that fails is rescheduled with exponential backoff.
func (l *Pebble) Run(ctx context.Context, h Handler) error {
	tick := time.NewTicker(l.cfg.Poll)
	defer tick.Stop()
	for {
		if err := l.runDue(ctx, h); err != nil && ctx.Err() == nil {
			l.cfg.Logger.Error("ledger pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		case <-l.wake:
		}
	}
}

func (l *Pebble) runDue(ctx context.Context, h Handler) error {
	now := time.Now().UnixMilli()
	it, err := l.db.NewIter(nil)
	if err != nil {
		return err
	}
	var due []Task
	for ok := it.First(); ok && len(due) < 256; ok = it.Next() {
		var t Task
		if err := json.Unmarshal(it.Value(), &t); err != nil {
			return errors.Join(fmt.Errorf("ledger: corrupt task %x: %w", it.Key(), err), it.Close())
		}
		if t.NextAt <= now {
			due = append(due, t)
		}
	}
	if err := it.Close(); err != nil {
		return err
	}
	for _, t := range due {
		if ctx.Err() != nil {
			return nil
		}
		if herr := h(ctx, t); herr == nil {
			if err := l.db.Delete(key(t.ID), cpebble.Sync); err != nil {
				return err
			}
			l.backlog.Add(-1)
			continue
		} else {
			l.cfg.Logger.Warn("compensation task failed; will retry", "kind", t.Kind, "conv", t.Conv, "seq", t.Seq, "attempts", t.Attempts+1, "err", herr)
		}
		t.Attempts++
		back := l.cfg.MinBackoff << min(t.Attempts-1, 20)
		t.NextAt = time.Now().Add(min(back, l.cfg.MaxBackoff)).UnixMilli()
		v, _ := json.Marshal(t)
		if err := l.db.Set(key(t.ID), v, cpebble.NoSync); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the database; it is idempotent.
func (l *Pebble) Close() error {
	var err error
	l.closeMu.Do(func() { err = l.db.Close() })
	return err
}

// pebbleLog routes pebble's printf-style log into slog.
type pebbleLog struct{ l *slog.Logger }

func (p pebbleLog) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "ledger")
}

func (p pebbleLog) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "ledger")
}

func (p pebbleLog) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "ledger")
	panic(fmt.Sprintf(format, args...))
}
