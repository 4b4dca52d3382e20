// Package pebble is the webhook queue of the embedded mode (hooks.Queue):
// a Pebble database of its own (data_dir/webhooks). An event for an
// endpoint is one key
//
//	'q' name 0x00 conv(8, big endian) seq(8) type(1)  →  attempts(4) queued-at(8, unix ms) body
//
// so one endpoint's events of one conversation sort in delivery order, and
// a dead letter moves under 'd' with the same suffix (value: a
// hooks.DeadLetter as JSON). Put syncs; an attempt's outcome does not,
// except a dead letter: after a crash an event may be attempted again, or
// one attempt more (at least once). Attempts and queued-at survive
// restarts, so an event's settle and its attempts count from when it was
// first queued.
//
// Each endpoint is one lane (hooks.Lane), never lost. Queue is safe for
// concurrent use; it passes internal/hooks/hookstest.
package pebble

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

	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/pebblelog"
)

// Config of a Pebble queue.
type Config struct {
	Dir    string
	FS     vfs.FS // nil: disk
	Logger *slog.Logger
}

// Queue keeps webhook events in a Pebble database.
type Queue struct {
	db        *cpebble.DB
	closeOnce sync.Once

	mu     sync.Mutex
	counts map[string]*counts // per endpoint name
	wake   map[string]chan struct{}
}

type counts struct{ backlog, dead atomic.Int64 }

var _ hooks.Queue = (*Queue)(nil)

// Open opens (or creates) the queue at cfg.Dir and counts what it holds.
func Open(cfg Config) (*Queue, error) {
	if cfg.FS == nil {
		cfg.FS = vfs.Default
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	db, err := cpebble.Open(cfg.Dir, &cpebble.Options{FS: cfg.FS, Logger: pebblelog.New(cfg.Logger, "webhooks")})
	if err != nil {
		return nil, fmt.Errorf("webhooks: pebble: open: %w", err)
	}
	q := &Queue{db: db, counts: map[string]*counts{}, wake: map[string]chan struct{}{}}
	if err := q.count(); err != nil {
		db.Close()
		return nil, fmt.Errorf("webhooks: pebble: open: %w", err)
	}
	return q, nil
}

// count reads the queued events and dead letters of every endpoint.
func (q *Queue) count() error {
	it, err := q.db.NewIter(nil)
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 1+1+keySuffix || k[len(k)-keySuffix-1] != 0 {
			continue
		}
		c := q.countsOf(string(k[1 : len(k)-keySuffix-1]))
		switch k[0] {
		case 'q':
			c.backlog.Add(1)
		case 'd':
			c.dead.Add(1)
		}
	}
	return it.Close()
}

func (q *Queue) countsOf(name string) *counts {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := q.counts[name]
	if c == nil {
		c = &counts{}
		q.counts[name] = c
	}
	return c
}

func (q *Queue) wakeOf(name string) chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.wake[name]
	if w == nil {
		w = make(chan struct{}, 1)
		q.wake[name] = w
	}
	return w
}

func (q *Queue) poke(name string) {
	select {
	case q.wakeOf(name) <- struct{}{}:
	default:
	}
}

// keySuffix is the size of a key's conv, seq and type.
const keySuffix = 17

func prefix(kind byte, name string) []byte {
	b := make([]byte, 0, len(name)+2+keySuffix)
	b = append(b, kind)
	b = append(b, name...)
	return append(b, 0)
}

func appendKey(b []byte, k hooks.Key) []byte {
	b = binary.BigEndian.AppendUint64(b, k.Conv)
	b = binary.BigEndian.AppendUint64(b, k.Seq)
	return append(b, k.Type)
}

func parseKey(p, key []byte) (hooks.Key, bool) {
	if len(key) != len(p)+keySuffix {
		return hooks.Key{}, false
	}
	s := key[len(p):]
	return hooks.Key{Conv: binary.BigEndian.Uint64(s), Seq: binary.BigEndian.Uint64(s[8:]), Type: s[16]}, true
}

// valueHeader is the size of a queued value's attempts and queued-at.
const valueHeader = 12

func value(h hooks.Head) []byte {
	v := binary.BigEndian.AppendUint32(make([]byte, 0, valueHeader+len(h.Body)), uint32(h.Attempts))
	v = binary.BigEndian.AppendUint64(v, uint64(h.Queued.UnixMilli()))
	return append(v, h.Body...)
}

func parseValue(k hooks.Key, v []byte) (hooks.Head, bool) {
	if len(v) < valueHeader {
		return hooks.Head{}, false
	}
	return hooks.Head{Key: k, Attempts: int(binary.BigEndian.Uint32(v)), Queued: time.UnixMilli(int64(binary.BigEndian.Uint64(v[4:]))),
		Body: append([]byte(nil), v[valueHeader:]...)}, true
}

// Put stores the events not queued already in one synced batch; one
// queued already keeps its attempts.
func (q *Queue) Put(_ context.Context, evs []hooks.Event) error {
	b := q.db.NewBatch()
	defer b.Close()
	now := time.Now()
	var fresh []string
	seen := make(map[string]bool, len(evs))
	for _, ev := range evs {
		k := appendKey(prefix('q', ev.Endpoint), ev.Key)
		if seen[string(k)] {
			continue
		}
		seen[string(k)] = true
		if _, c, err := q.db.Get(k); err == nil {
			c.Close() // produced again (a repeated fan-out)
			continue
		} else if !errors.Is(err, cpebble.ErrNotFound) {
			return fmt.Errorf("webhooks: pebble: put: %w", err)
		}
		if err := b.Set(k, value(hooks.Head{Key: ev.Key, Queued: now, Body: ev.Body}), nil); err != nil {
			return fmt.Errorf("webhooks: pebble: put: %w", err)
		}
		fresh = append(fresh, ev.Endpoint)
	}
	if b.Empty() {
		return nil
	}
	if err := b.Commit(cpebble.Sync); err != nil {
		return fmt.Errorf("webhooks: pebble: put: %w", err)
	}
	for _, name := range fresh {
		q.countsOf(name).backlog.Add(1)
		q.poke(name)
	}
	return nil
}

// Serve runs one lane per endpoint until ctx ends.
func (q *Queue) Serve(ctx context.Context, endpoints []string, deliver func(context.Context, string, hooks.Lane)) {
	var wg sync.WaitGroup
	for _, name := range endpoints {
		l := &lane{q: q, name: name, wake: q.wakeOf(name)}
		wg.Go(func() { deliver(ctx, name, l) })
	}
	wg.Wait()
}

// Stats returns the endpoint's queued events and dead letters.
func (q *Queue) Stats(endpoint string) (backlog, dead int64) {
	c := q.countsOf(endpoint)
	return c.backlog.Load(), c.dead.Load()
}

// Dead lists the endpoint's dead letters in key order.
func (q *Queue) Dead(_ context.Context, endpoint string) ([]hooks.DeadLetter, error) {
	p := prefix('d', endpoint)
	it, err := q.db.NewIter(&cpebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
	if err != nil {
		return nil, fmt.Errorf("webhooks: pebble: dead: %w", err)
	}
	var out []hooks.DeadLetter
	for ok := it.First(); ok; ok = it.Next() {
		var r hooks.DeadLetter
		if err := json.Unmarshal(it.Value(), &r); err == nil {
			out = append(out, r)
		}
	}
	return out, it.Close()
}

// Close closes the database; it is idempotent.
func (q *Queue) Close() error {
	var err error
	q.closeOnce.Do(func() { err = q.db.Close() })
	return err
}

// upper bounds an iteration over the keys under prefix p (which ends in 0).
func upper(p []byte) []byte {
	u := append([]byte(nil), p...)
	u[len(u)-1] = 1
	return u
}

// lane is one endpoint's events.
type lane struct {
	q    *Queue
	name string
	wake chan struct{}
}

// Heads scans the endpoint's conversations from conversation from,
// wrapping around. Each head is read again after the scan, whose snapshot
// may hold one delivered (or retried) since.
func (l *lane) Heads(_ context.Context, from uint64, limit int, skip func(conv uint64) bool) ([]hooks.Head, error) {
	p := prefix('q', l.name)
	it, err := l.q.db.NewIter(&cpebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
	if err != nil {
		return nil, err
	}
	var keys []hooks.Key
	more := map[hooks.Key]bool{}
	scan := func(start, stop uint64, bounded bool) {
		ok := it.SeekGE(appendKey(p, hooks.Key{Conv: start}))
		for ok && len(keys) < limit {
			k, valid := parseKey(p, it.Key())
			if !valid {
				ok = it.Next()
				continue
			}
			if bounded && k.Conv >= stop {
				return
			}
			if !skip(k.Conv) {
				keys = append(keys, k)
				// One step on tells whether the conversation has more.
				if it.Next() {
					if n, valid := parseKey(p, it.Key()); valid && n.Conv == k.Conv {
						more[k] = true
					}
				}
			}
			if k.Conv == ^uint64(0) {
				return
			}
			ok = it.SeekGE(appendKey(p, hooks.Key{Conv: k.Conv + 1}))
		}
	}
	scan(from, 0, false)
	if from > 0 && len(keys) < limit {
		scan(0, from, true)
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	out := make([]hooks.Head, 0, len(keys))
	for _, k := range keys {
		v, c, err := l.q.db.Get(appendKey(p, k))
		if errors.Is(err, cpebble.ErrNotFound) {
			// Finished since the scan: the conversation's next event
			// is for the next one.
			l.q.poke(l.name)
			continue
		}
		if err != nil {
			return out, err
		}
		h, ok := parseValue(k, v)
		c.Close()
		if ok {
			h.More = more[k]
			out = append(out, h)
		}
	}
	return out, nil
}

// Done deletes a delivered event (not synced: after a crash it may be
// sent again).
func (l *lane) Done(_ context.Context, h hooks.Head) error {
	if err := l.q.db.Delete(appendKey(prefix('q', l.name), h.Key), cpebble.NoSync); err != nil {
		return err
	}
	l.q.countsOf(l.name).backlog.Add(-1)
	return nil
}

// Retry writes the event's attempts.
func (l *lane) Retry(_ context.Context, h hooks.Head) error {
	return l.q.db.Set(appendKey(prefix('q', l.name), h.Key), value(h), cpebble.NoSync)
}

// Bury moves an event to the dead letters in one synced batch.
func (l *lane) Bury(_ context.Context, h hooks.Head, cause string) error {
	rec, err := json.Marshal(hooks.DeadLetter{Attempts: h.Attempts, Error: cause, At: time.Now().UnixMilli(), Event: h.Body})
	if err != nil {
		return err
	}
	b := l.q.db.NewBatch()
	defer b.Close()
	if err := b.Delete(appendKey(prefix('q', l.name), h.Key), nil); err != nil {
		return err
	}
	if err := b.Set(appendKey(prefix('d', l.name), h.Key), rec, nil); err != nil {
		return err
	}
	if err := b.Commit(cpebble.Sync); err != nil {
		return err
	}
	c := l.q.countsOf(l.name)
	c.backlog.Add(-1)
	c.dead.Add(1)
	return nil
}

func (l *lane) Changed() <-chan struct{} { return l.wake }

// Err is always nil: an embedded node delivers every endpoint itself.
func (l *lane) Err() error { return nil }

// Checkpoint writes a consistent copy of the database to dir, which must
// not exist, while it keeps serving: sstables are hard-linked where the
// file system allows, the WAL is flushed first so every write acknowledged
// before the call is in the copy. The copy opens as a database of its own.
func (q *Queue) Checkpoint(dir string) error {
	if err := q.db.Checkpoint(dir, cpebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("pebble: checkpoint %s: %w", dir, err)
	}
	return nil
}

// Exported is one event of the database, as Export lists it: queued
// (Head with its attempts and queued-at as stored), or a dead letter.
type Exported struct {
	Endpoint string
	Head     hooks.Head
	Dead     *hooks.DeadLetter // a dead letter; Head.Key is its event's
	// Cursor is this event's place: Export from it lists the ones after.
	Cursor []byte
}

// Export lists at most limit events after cursor (nil: from the first),
// dead letters (of every endpoint) before queued events, each in key
// order. It only reads: a copy of a stopped node's queue (parley migrate
// --from) pages through it and records the last cursor it finished.
func (q *Queue) Export(_ context.Context, after []byte, limit int) ([]Exported, error) {
	o := &cpebble.IterOptions{}
	if after != nil {
		o.LowerBound = append(append([]byte(nil), after...), 0)
	}
	it, err := q.db.NewIter(o)
	if err != nil {
		return nil, fmt.Errorf("webhooks: pebble: export: %w", err)
	}
	var out []Exported
	for ok := it.First(); ok && len(out) < limit; ok = it.Next() {
		k := it.Key()
		if len(k) < 1+1+keySuffix || k[len(k)-keySuffix-1] != 0 || (k[0] != 'q' && k[0] != 'd') {
			continue
		}
		name := string(k[1 : len(k)-keySuffix-1])
		key, _ := parseKey(prefix(k[0], name), k)
		e := Exported{Endpoint: name, Cursor: append([]byte(nil), k...)}
		if k[0] == 'd' {
			var d hooks.DeadLetter
			if err := json.Unmarshal(it.Value(), &d); err != nil {
				continue // unreadable: Dead skips it too
			}
			e.Head.Key, e.Dead = key, &d
		} else {
			h, valid := parseValue(key, it.Value())
			if !valid {
				continue
			}
			e.Head = h
		}
		out = append(out, e)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("webhooks: pebble: export: %w", err)
	}
	return out, nil
}
