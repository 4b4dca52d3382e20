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
// The queued keys are also indexed in memory, per endpoint, by
// conversation (its events' keys in delivery order): built from one scan
// when the queue opens and kept by every write that adds or removes an
// event, so Heads reads the next due conversations from memory and only
// their values from the database. A scan of the database would step over
// the deletions of every event removed since Pebble last compacted them,
// and the dispatcher scans once per few events. The database stays the
// truth: a restart builds the index again from it.
//
// Each endpoint is one lane (hooks.Lane), never lost. Queue is safe for
// concurrent use; it passes internal/hooks/hookstest.
package pebble

import (
	"cmp"
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

	"github.com/RaduBerinde/btreemap"
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

	mu  sync.Mutex
	eps map[string]*endpoint // per endpoint name
}

// endpoint is one endpoint's events as the queue holds them in memory.
type endpoint struct {
	wake          chan struct{}
	backlog, dead atomic.Int64

	// mu guards convs, the index of the endpoint's queued events:
	// conversation → its events' keys in delivery order. It mirrors the
	// 'q' keys: every write updates it after committing (while the
	// database holds an event the index may not yet, never the reverse
	// for long: Heads finds a removed one gone and moves on).
	mu    sync.Mutex
	convs *btreemap.BTreeMap[uint64, *pending]
}

// pending is one conversation's queued keys, in delivery order.
type pending struct{ keys []hooks.Key }

func compareKeys(a, b hooks.Key) int {
	switch {
	case a.Less(b):
		return -1
	case b.Less(a):
		return 1
	}
	return 0
}

// add indexes k; false if it was indexed already.
func (e *endpoint) add(k hooks.Key) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, p, ok := e.convs.Get(k.Conv)
	if !ok {
		e.convs.ReplaceOrInsert(k.Conv, &pending{keys: []hooks.Key{k}})
		e.backlog.Add(1)
		return true
	}
	i, found := slices.BinarySearchFunc(p.keys, k, compareKeys)
	if found {
		return false
	}
	p.keys = slices.Insert(p.keys, i, k)
	e.backlog.Add(1)
	return true
}

// remove drops k from the index; false if it was not indexed.
func (e *endpoint) remove(k hooks.Key) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, p, ok := e.convs.Get(k.Conv)
	if !ok {
		return false
	}
	i, found := slices.BinarySearchFunc(p.keys, k, compareKeys)
	if !found {
		return false
	}
	if p.keys = slices.Delete(p.keys, i, i+1); len(p.keys) == 0 {
		e.convs.Delete(k.Conv)
	}
	e.backlog.Add(-1)
	return true
}

// has reports whether k is indexed.
func (e *endpoint) has(k hooks.Key) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, p, ok := e.convs.Get(k.Conv)
	if !ok {
		return false
	}
	_, found := slices.BinarySearchFunc(p.keys, k, compareKeys)
	return found
}

var _ hooks.Queue = (*Queue)(nil)

// Open opens (or creates) the queue at cfg.Dir and indexes what it holds.
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
	q := &Queue{db: db, eps: map[string]*endpoint{}}
	if err := q.load(); err != nil {
		db.Close()
		return nil, fmt.Errorf("webhooks: pebble: open: %w", err)
	}
	return q, nil
}

// load indexes the queued events and counts the dead letters of every
// endpoint.
func (q *Queue) load() error {
	it, err := q.db.NewIter(nil)
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 1+1+keySuffix || k[len(k)-keySuffix-1] != 0 {
			continue
		}
		name := string(k[1 : len(k)-keySuffix-1])
		e := q.endpoint(name)
		switch k[0] {
		case 'q':
			if key, ok := parseKey(prefix('q', name), k); ok {
				e.add(key)
			}
		case 'd':
			e.dead.Add(1)
		}
	}
	return it.Close()
}

func (q *Queue) endpoint(name string) *endpoint {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.eps[name]
	if e == nil {
		e = &endpoint{wake: make(chan struct{}, 1), convs: btreemap.New[uint64, *pending](16, cmp.Compare[uint64])}
		q.eps[name] = e
	}
	return e
}

func (e *endpoint) poke() {
	select {
	case e.wake <- struct{}{}:
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
	type put struct {
		e *endpoint
		k hooks.Key
	}
	var fresh []put
	seen := make(map[string]bool, len(evs))
	for _, ev := range evs {
		k := appendKey(prefix('q', ev.Endpoint), ev.Key)
		if seen[string(k)] {
			continue
		}
		seen[string(k)] = true
		e := q.endpoint(ev.Endpoint)
		if e.has(ev.Key) {
			continue // produced again (a repeated fan-out)
		}
		if err := b.Set(k, value(hooks.Head{Key: ev.Key, Queued: now, Body: ev.Body}), nil); err != nil {
			return fmt.Errorf("webhooks: pebble: put: %w", err)
		}
		fresh = append(fresh, put{e, ev.Key})
	}
	if b.Empty() {
		return nil
	}
	if err := b.Commit(cpebble.Sync); err != nil {
		return fmt.Errorf("webhooks: pebble: put: %w", err)
	}
	for _, f := range fresh {
		f.e.add(f.k)
		f.e.poke()
	}
	return nil
}

// Serve runs one lane per endpoint until ctx ends.
func (q *Queue) Serve(ctx context.Context, endpoints []string, deliver func(context.Context, string, hooks.Lane)) {
	var wg sync.WaitGroup
	for _, name := range endpoints {
		l := &lane{q: q, name: name, ep: q.endpoint(name)}
		wg.Go(func() { deliver(ctx, name, l) })
	}
	wg.Wait()
}

// Stats returns the endpoint's queued events and dead letters.
func (q *Queue) Stats(endpoint string) (backlog, dead int64) {
	e := q.endpoint(endpoint)
	return e.backlog.Load(), e.dead.Load()
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
	ep   *endpoint
}

// Heads walks the index from conversation from, wrapping around, then
// reads each head's value. skip is called with the index locked (it must
// not call the queue). A head removed since it was indexed is passed over.
func (l *lane) Heads(_ context.Context, from uint64, limit int, skip func(conv uint64) bool) ([]hooks.Head, error) {
	type pick struct {
		k    hooks.Key
		more bool
	}
	var picks []pick
	visit := func(conv uint64, p *pending) bool {
		if len(picks) >= limit {
			return false
		}
		if !skip(conv) {
			picks = append(picks, pick{p.keys[0], len(p.keys) > 1})
		}
		return true
	}
	l.ep.mu.Lock()
	l.ep.convs.AscendFunc(btreemap.GE(from), btreemap.Max[uint64](), visit)
	if from > 0 && len(picks) < limit {
		l.ep.convs.AscendFunc(btreemap.Min[uint64](), btreemap.LT(from), visit)
	}
	l.ep.mu.Unlock()
	p := prefix('q', l.name)
	out := make([]hooks.Head, 0, len(picks))
	for _, pk := range picks {
		v, c, err := l.q.db.Get(appendKey(p, pk.k))
		if errors.Is(err, cpebble.ErrNotFound) {
			// Finished since: the conversation's next event is for
			// the next call.
			l.ep.poke()
			continue
		}
		if err != nil {
			return out, err
		}
		h, ok := parseValue(pk.k, v)
		c.Close()
		if ok {
			h.More = pk.more
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
	l.ep.remove(h.Key)
	return nil
}

// Retry writes the event's attempts.
func (l *lane) Retry(_ context.Context, h hooks.Head) error {
	if err := l.q.db.Set(appendKey(prefix('q', l.name), h.Key), value(h), cpebble.NoSync); err != nil {
		return err
	}
	l.ep.add(h.Key) // indexed already unless it was removed meanwhile
	return nil
}

// Bury moves an event to the dead letters in one synced batch.
func (l *lane) Bury(_ context.Context, h hooks.Head, cause string) error {
	rec, err := json.Marshal(hooks.DeadLetter{Attempts: h.Attempts, Error: cause, At: time.Now().UnixMilli(), Event: h.Body})
	if err != nil {
		return err
	}
	dk := appendKey(prefix('d', l.name), h.Key)
	// The same event queued again and buried again keeps one dead
	// letter, the last: count it once.
	_, c, err := l.q.db.Get(dk)
	again := err == nil
	if again {
		c.Close()
	} else if !errors.Is(err, cpebble.ErrNotFound) {
		return err
	}
	b := l.q.db.NewBatch()
	defer b.Close()
	if err := b.Delete(appendKey(prefix('q', l.name), h.Key), nil); err != nil {
		return err
	}
	if err := b.Set(dk, rec, nil); err != nil {
		return err
	}
	if err := b.Commit(cpebble.Sync); err != nil {
		return err
	}
	l.ep.remove(h.Key)
	if !again {
		l.ep.dead.Add(1)
	}
	return nil
}

func (l *lane) Changed() <-chan struct{} { return l.ep.wake }

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
