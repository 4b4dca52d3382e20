// Package pebble is the compensation ledger of the embedded mode
// (ledger.Ledger) in a Pebble database of its own next to the store
// (data_dir/ledger). It follows ledger.Policy like the JetStream engine and
// passes the same conformance suite (internal/ledger/ledgertest). Ledger
// is safe for concurrent use; one Run at a time retries the due tasks.
package pebble

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

	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/pebblelog"
)

// Config of a Pebble ledger.
type Config struct {
	Dir    string
	FS     vfs.FS // nil: disk
	Policy ledger.Policy
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

// Ledger is a durable ledger.Ledger in its own Pebble database. A pending task
// is stored under its 8-byte big-endian id, a dead one under deadPrefix
// and its id; a task's attempt count is written (synced) before each
// attempt, so an attempt cut short by a crash still counts.
type Ledger struct {
	cfg     Config
	db      *cpebble.DB
	nextID  atomic.Uint64
	backlog atomic.Int64
	wake    chan struct{}
	closeMu sync.Once
}

var _ ledger.Ledger = (*Ledger)(nil)

// deadPrefix sorts after every pending key (ids never reach 0xff<<56).
var deadPrefix = []byte{0xff, 'd'}

// pendingBounds bounds an iterator to the pending tasks.
var pendingBounds = &cpebble.IterOptions{UpperBound: deadPrefix[:1]}

// Open opens (or creates) the ledger at cfg.Dir and counts its backlog.
func Open(cfg Config) (*Ledger, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	opts := &cpebble.Options{FS: cfg.FS, Logger: pebblelog.New(cfg.Logger, "ledger")}
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	db, err := cpebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("ledger: pebble: open: %w", err)
	}
	l := &Ledger{cfg: cfg, db: db, wake: make(chan struct{}, 1)}
	it, err := db.NewIter(nil)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: pebble: open: %w", err)
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
		return nil, fmt.Errorf("ledger: pebble: open: %w", err)
	}
	l.backlog.Store(n)
	return l, nil
}

func key(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }
func deadKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(append([]byte(nil), deadPrefix...), id)
}

// Record stores t durably (fsync) for retry; it is due at once.
func (l *Ledger) Record(_ context.Context, t ledger.Task) error {
	if !ledger.ValidKind(t.Kind) {
		return fmt.Errorf("%w %q", ledger.ErrKind, t.Kind)
	}
	t.ID = l.nextID.Add(1)
	t.Attempts, t.NextAt, t.Error = 0, 0, ""
	v, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("ledger: pebble: record: %w", err)
	}
	if err := l.db.Set(key(t.ID), v, cpebble.Sync); err != nil {
		return fmt.Errorf("ledger: pebble: record: %w", err)
	}
	l.backlog.Add(1)
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// Backlog is the number of tasks neither completed nor dead.
func (l *Ledger) Backlog() int { return int(l.backlog.Load()) }

// Run retries due tasks until ctx ends: a task whose handler succeeds is
// deleted; one that fails is rescheduled with exponential backoff, or
// moved to the dead tasks after its last attempt.
func (l *Ledger) Run(ctx context.Context, h ledger.Handler) error {
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

func (l *Ledger) runDue(ctx context.Context, h ledger.Handler) error {
	now := time.Now().UnixMilli()
	it, err := l.db.NewIter(pendingBounds)
	if err != nil {
		return err
	}
	var (
		due []ledger.Task
		bad [][]byte // undecodable: dead at once
	)
	for ok := it.First(); ok && len(due) < 256; ok = it.Next() {
		var t ledger.Task
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
		t := ledger.Task{ID: l.nextID.Add(1)}
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
func (l *Ledger) bury(k []byte, t ledger.Task, cause error) error {
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
func (l *Ledger) Dead(_ context.Context, max int) ([]ledger.Task, error) {
	it, err := l.db.NewIter(&cpebble.IterOptions{LowerBound: deadPrefix, UpperBound: []byte{0xff, 'd' + 1}})
	if err != nil {
		return nil, fmt.Errorf("ledger: pebble: dead: %w", err)
	}
	var out []ledger.Task
	for ok := it.First(); ok && len(out) < max; ok = it.Next() {
		var t ledger.Task
		if err := json.Unmarshal(it.Value(), &t); err != nil {
			return nil, errors.Join(fmt.Errorf("ledger: pebble: dead: %w", err), it.Close())
		}
		out = append(out, t)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("ledger: pebble: dead: %w", err)
	}
	return out, nil
}

// Close closes the database; it is idempotent.
func (l *Ledger) Close() error {
	var err error
	l.closeMu.Do(func() { err = l.db.Close() })
	return err
}

// Checkpoint writes a consistent copy of the database to dir, which must
// not exist, while it keeps serving: sstables are hard-linked where the
// file system allows, the WAL is flushed first so every write acknowledged
// before the call is in the copy. The copy opens as a database of its own.
func (l *Ledger) Checkpoint(dir string) error {
	if err := l.db.Checkpoint(dir, cpebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("pebble: checkpoint %s: %w", dir, err)
	}
	return nil
}

// Exported is one task of the database, as Export lists it.
type Exported struct {
	Task ledger.Task // as stored: a pending one's attempts and next-at, a dead one's error
	Dead bool
	// Cursor is this task's place: Export from it lists the ones after.
	Cursor []byte
}

// Export lists at most limit tasks after cursor (nil: from the first),
// pending tasks in id order, then dead ones. It only reads: a copy of a
// stopped node's ledger (parley migrate --from) pages through it and
// records the last cursor it finished. Undecodable tasks are passed over
// (Run buries them).
func (l *Ledger) Export(_ context.Context, after []byte, limit int) ([]Exported, error) {
	o := &cpebble.IterOptions{}
	if after != nil {
		o.LowerBound = append(slices.Clone(after), 0)
	}
	it, err := l.db.NewIter(o)
	if err != nil {
		return nil, fmt.Errorf("ledger: pebble: export: %w", err)
	}
	var out []Exported
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		k := it.Key()
		dead := bytes.HasPrefix(k, deadPrefix)
		if dead && len(k) != len(deadPrefix)+8 || !dead && len(k) != 8 {
			continue
		}
		var t ledger.Task
		if err := json.Unmarshal(it.Value(), &t); err != nil {
			continue
		}
		out = append(out, Exported{Task: t, Dead: dead, Cursor: slices.Clone(k)})
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("ledger: pebble: export: %w", err)
	}
	return out, nil
}
