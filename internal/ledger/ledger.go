// Package ledger is the compensation ledger of group fan-out: when a
// conversation-row write or a push fails after the message is stored, the
// failure is recorded durably as a task (conversation, seq, member range)
// and retried with backoff until it succeeds or is given up. The stored
// message is never rolled back; a task only re-applies idempotent work.
//
// Ledger is the seam; this package holds a Pebble-backed engine for the
// embedded mode (a small database of its own next to the store), and
// internal/ledger/jetstream the JetStream engine of cluster mode. Both
// follow one Policy and pass one conformance suite (internal/ledger/
// ledgertest):
//
//   - Record stores a task durably; it is due at once.
//   - Run hands each due task to the handler, with Attempts set to the
//     attempt's number (1 for the first) and a ctx bounded by
//     Policy.Timeout. Delivery is at least once: handlers must be
//     idempotent.
//   - A failed attempt is retried after Policy.Backoff(attempt). After
//     Policy.MaxAttempts failed attempts the task is dead: out of the
//     backlog, listed by Dead with its last error.
//   - Every started attempt counts, including one cut short by a stop or a
//     crash: the task runs again after a restart (JetStream: after Timeout
//     for a crashed consumer), and dies if that was its last attempt. A
//     task that cannot be decoded dies at once.
//
// Both engines are safe for concurrent use.
package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	ID      uint64   `json:"id"`
	Kind    string   `json:"kind"`
	Conv    uint64   `json:"conv"`
	Seq     uint64   `json:"seq"`
	Users   []string `json:"users"`
	Mention bool     `json:"mention,omitempty"`
	Node    string   `json:"node,omitempty"`
	// Attempts is the number of the attempt a handler runs (1 for the
	// first); on a dead task, the attempts made.
	Attempts int   `json:"attempts"`
	NextAt   int64 `json:"next_at"` // unix ms (Pebble)
	// Error is a dead task's last error.
	Error string `json:"error,omitempty"`
}

// Handler redoes a task; an error schedules another attempt.
type Handler func(ctx context.Context, t Task) error

// Ledger records failed fan-out work and retries it (see the package
// comment for the behaviour every engine shares).
type Ledger interface {
	// Record stores t durably; its ID, Attempts, NextAt and Error are
	// the ledger's. A kind other than KindRows and KindPush is refused
	// (ErrKind).
	Record(ctx context.Context, t Task) error
	// Run retries due tasks with h until ctx ends.
	Run(ctx context.Context, h Handler) error
	// Backlog is the number of tasks neither completed nor dead, as
	// last counted (JetStream: polled every 2 s, and shared by every
	// process of the deployment).
	Backlog() int
	// Dead lists at most max dead tasks, oldest first.
	Dead(ctx context.Context, max int) ([]Task, error)
}

// ErrKind: Record was given a task of an unknown kind, which no Run
// would ever handle.
var ErrKind = errors.New("ledger: unknown task kind")

// ValidKind reports whether Run handles tasks of kind.
func ValidKind(kind string) bool { return kind == KindRows || kind == KindPush }

// Kinds are the task kinds, in the order engines list them.
var Kinds = []string{KindRows, KindPush}

// Policy is the retry policy of every engine.
type Policy struct {
	// A task's attempt n fails → the next one after
	// MinBackoff·2^(n-1), at most MaxBackoff. Defaults 100ms and 1m.
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts bounds the attempts of a task; after the last one
	// fails the task is dead. Default 16 (about 7 minutes of retries
	// with the default backoff).
	MaxAttempts int
	// Timeout bounds one attempt: the handler's ctx ends after it, and
	// JetStream redelivers a crashed consumer's task after it. Default
	// 30s.
	Timeout time.Duration
}

// WithDefaults fills the zero fields.
func (p Policy) WithDefaults() Policy {
	if p.MinBackoff <= 0 {
		p.MinBackoff = 100 * time.Millisecond
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = time.Minute
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 16
	}
	if p.Timeout <= 0 {
		p.Timeout = 30 * time.Second
	}
	return p
}

// Validate reports a policy no engine can follow.
func (p Policy) Validate() error {
	d := p.WithDefaults()
	if d.MaxBackoff < d.MinBackoff {
		return fmt.Errorf("ledger: policy: MaxBackoff %s below MinBackoff %s", d.MaxBackoff, d.MinBackoff)
	}
	return nil
}

// Backoff is the wait after a task's attempt-th failure (attempt ≥ 1).
func (p Policy) Backoff(attempt int) time.Duration {
	p = p.WithDefaults()
	d := p.MinBackoff
	for i := 1; i < attempt && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

// Config of the Pebble ledger.
type Config struct {
	Dir    string
	FS     vfs.FS // nil: disk
	Policy Policy
	Poll   time.Duration // how often due tasks are looked for
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.Policy = c.Policy.WithDefaults()
	if c.Poll <= 0 {
		c.Poll = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Pebble is a durable Ledger in its own Pebble database. A pending task
// is stored under its 8-byte big-endian id, a dead one under deadPrefix
// and its id; a task's attempt count is written (synced) before each
// attempt, so an attempt cut short by a crash still counts.
type Pebble struct {
	cfg     Config
	db      *cpebble.DB
	nextID  atomic.Uint64
	backlog atomic.Int64
	wake    chan struct{}
	closeMu sync.Once
}

var _ Ledger = (*Pebble)(nil)

// deadPrefix sorts after every pending key (ids never reach 0xff<<56).
var deadPrefix = []byte{0xff, 'd'}

// pendingBounds bounds an iterator to the pending tasks.
var pendingBounds = &cpebble.IterOptions{UpperBound: deadPrefix[:1]}

// Open opens (or creates) the ledger at cfg.Dir and counts its backlog.
func Open(cfg Config) (*Pebble, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
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
		k := it.Key()
		if bytes.HasPrefix(k, deadPrefix) {
			k = k[len(deadPrefix):]
		} else {
			n++
		}
		if len(k) == 8 {
			l.nextID.Store(max(l.nextID.Load(), binary.BigEndian.Uint64(k)))
		}
	}
	if err := it.Close(); err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	l.backlog.Store(n)
	return l, nil
}

func key(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }
func deadKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte(nil), deadPrefix...), id)
}

// Record stores t durably (fsync) for retry; it is due at once.
func (l *Pebble) Record(_ context.Context, t Task) error {
	if !ValidKind(t.Kind) {
		return fmt.Errorf("%w %q", ErrKind, t.Kind)
	}
	t.ID = l.nextID.Add(1)
	t.Attempts, t.NextAt, t.Error = 0, 0, ""
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

// Backlog is the number of tasks neither completed nor dead.
func (l *Pebble) Backlog() int { return int(l.backlog.Load()) }

// Run retries due tasks until ctx ends: a task whose handler succeeds is
// deleted; one that fails is rescheduled with exponential backoff, or
// moved to the dead tasks after its last attempt.
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
	it, err := l.db.NewIter(pendingBounds)
	if err != nil {
		return err
	}
	var (
		due []Task
		bad [][]byte // undecodable: dead at once
	)
	for ok := it.First(); ok && len(due) < 256; ok = it.Next() {
		var t Task
		if err := json.Unmarshal(it.Value(), &t); err != nil || len(it.Key()) != 8 {
			bad = append(bad, slices.Clone(it.Key()))
			continue
		}
		if t.NextAt <= now {
			due = append(due, t)
		}
	}
	if err := it.Close(); err != nil {
		return err
	}
	for _, k := range bad {
		t := Task{ID: l.nextID.Add(1)}
		if err := l.bury(k, t, fmt.Errorf("undecodable task %x", k)); err != nil {
			return err
		}
	}
	p := l.cfg.Policy
	for _, t := range due {
		if ctx.Err() != nil {
			return nil
		}
		t.Attempts++
		if t.Attempts > p.MaxAttempts {
			// The last attempt was cut short (a crash).
			t.Attempts--
			if err := l.bury(key(t.ID), t, errors.New("last attempt interrupted")); err != nil {
				return err
			}
			continue
		}
		// The attempt counts from here, even if the process dies in it
		// (synced: tasks are rare, and a task that kills the process
		// must not get unbounded attempts).
		v, _ := json.Marshal(t)
		if err := l.db.Set(key(t.ID), v, cpebble.Sync); err != nil {
			return err
		}
		hctx, cancel := context.WithTimeout(ctx, p.Timeout)
		herr := h(hctx, t)
		cancel()
		switch {
		case herr == nil:
			if err := l.db.Delete(key(t.ID), cpebble.Sync); err != nil {
				return err
			}
			l.backlog.Add(-1)
		case t.Attempts >= p.MaxAttempts:
			// Even when stopping: run again, it would only die.
			if err := l.bury(key(t.ID), t, herr); err != nil {
				return err
			}
		case ctx.Err() != nil:
			return nil // due again at the next start
		default:
			l.cfg.Logger.Warn("compensation task failed; will retry", "kind", t.Kind, "conv", t.Conv, "seq", t.Seq, "attempt", t.Attempts, "err", herr)
			t.NextAt = time.Now().Add(p.Backoff(t.Attempts)).UnixMilli()
			v, _ := json.Marshal(t)
			if err := l.db.Set(key(t.ID), v, cpebble.NoSync); err != nil {
				return err
			}
		}
	}
	return nil
}

// bury moves t, pending under k, to the dead tasks in one synced batch.
func (l *Pebble) bury(k []byte, t Task, cause error) error {
	l.cfg.Logger.Error("compensation task failed for the last time; it is dead",
		"kind", t.Kind, "conv", t.Conv, "seq", t.Seq, "attempts", t.Attempts, "err", cause)
	t.Error, t.NextAt = cause.Error(), 0
	v, _ := json.Marshal(t)
	b := l.db.NewBatch()
	defer b.Close()
	_ = b.Delete(k, nil)
	_ = b.Set(deadKey(t.ID), v, nil)
	if err := b.Commit(cpebble.Sync); err != nil {
		return err
	}
	l.backlog.Add(-1)
	return nil
}

// Dead lists at most max dead tasks, oldest first.
func (l *Pebble) Dead(_ context.Context, max int) ([]Task, error) {
	it, err := l.db.NewIter(&cpebble.IterOptions{LowerBound: deadPrefix, UpperBound: []byte{0xff, 'd' + 1}})
	if err != nil {
		return nil, fmt.Errorf("ledger: dead: %w", err)
	}
	var out []Task
	for ok := it.First(); ok && len(out) < max; ok = it.Next() {
		var t Task
		if err := json.Unmarshal(it.Value(), &t); err != nil {
			return nil, errors.Join(fmt.Errorf("ledger: dead: %w", err), it.Close())
		}
		out = append(out, t)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("ledger: dead: %w", err)
	}
	return out, nil
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
