package hooks

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	cpebble "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// queue is the durable task queue of webhook deliveries: its own Pebble
// database (data_dir/webhooks). An event for an endpoint is one key
//
//	'q' name 0x00 conv(8, big endian) seq(8) type(1)  →  attempts(4) queued-at(8, unix ms) body
//
// so one endpoint's events of one conversation sort in delivery order. A
// dead letter moves under 'd' with the same suffix (value: deadRecord).
type queue struct {
	db *cpebble.DB
}

type qkey struct {
	conv, seq uint64
	typ       uint8
}

func prefix(kind byte, name string) []byte {
	b := make([]byte, 0, len(name)+2+17)
	b = append(b, kind)
	b = append(b, name...)
	return append(b, 0)
}

func (k qkey) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, k.conv)
	b = binary.BigEndian.AppendUint64(b, k.seq)
	return append(b, k.typ)
}

func parseKey(p, key []byte) (qkey, bool) {
	if len(key) != len(p)+17 {
		return qkey{}, false
	}
	s := key[len(p):]
	return qkey{conv: binary.BigEndian.Uint64(s), seq: binary.BigEndian.Uint64(s[8:]), typ: s[16]}, true
}

type deadRecord struct {
	Attempts int             `json:"attempts"`
	Error    string          `json:"error"`
	At       int64           `json:"at"` // unix ms
	Event    json.RawMessage `json:"event"`
}

func openQueue(dir string, fs vfs.FS, log *slog.Logger) (*queue, error) {
	if fs == nil {
		fs = vfs.Default
	}
	db, err := cpebble.Open(dir, &cpebble.Options{FS: fs, Logger: pebbleLog{log}})
	if err != nil {
		return nil, fmt.Errorf("webhooks: open queue: %w", err)
	}
	return &queue{db: db}, nil
}

func (q *queue) close() error { return q.db.Close() }

// item is one queued event for one endpoint.
type item struct {
	ep   int
	key  qkey
	body []byte
}

// put stores items durably (one fsync) and returns those that were not
// queued already.
func (q *queue) put(names []string, items []item, now time.Time) ([]item, error) {
	b := q.db.NewBatch()
	defer b.Close()
	var fresh []item
	for _, it := range items {
		k := it.key.append(prefix('q', names[it.ep]))
		if _, c, err := q.db.Get(k); err == nil {
			c.Close() // produced again (a repeated fan-out): keep its attempts
			continue
		} else if !errors.Is(err, cpebble.ErrNotFound) {
			return nil, err
		}
		fresh = append(fresh, it)
		v := binary.BigEndian.AppendUint32(make([]byte, 0, valueHeader+len(it.body)), 0)
		v = binary.BigEndian.AppendUint64(v, uint64(now.UnixMilli()))
		if err := b.Set(k, append(v, it.body...), nil); err != nil {
			return nil, err
		}
	}
	if b.Empty() {
		return nil, nil
	}
	return fresh, b.Commit(cpebble.Sync)
}

// valueHeader is the size of a queued value's attempts and queued-at.
const valueHeader = 12

// head is the first queued event of one conversation.
type head struct {
	key      qkey
	attempts int
	queued   time.Time
	body     []byte
}

func parseValue(k qkey, v []byte) (head, bool) {
	if len(v) < valueHeader {
		return head{}, false
	}
	return head{key: k, attempts: int(binary.BigEndian.Uint32(v)), queued: time.UnixMilli(int64(binary.BigEndian.Uint64(v[4:]))),
		body: append([]byte(nil), v[valueHeader:]...)}, true
}

// heads returns the first event of each conversation of endpoint name,
// starting at conversation from and wrapping around, at most limit; skip
// tells conversations to pass over (being delivered or waiting).
func (q *queue) heads(name string, from uint64, limit int, skip func(conv uint64) bool) ([]head, error) {
	p := prefix('q', name)
	upper := prefix('q', name)
	upper[len(upper)-1] = 1
	it, err := q.db.NewIter(&cpebble.IterOptions{LowerBound: p, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	var out []head
	scan := func(start uint64, stop uint64, bounded bool) {
		ok := it.SeekGE(qkey{conv: start}.append(p))
		for ok && len(out) < limit {
			k, valid := parseKey(p, it.Key())
			if !valid {
				ok = it.Next()
				continue
			}
			if bounded && k.conv >= stop {
				return
			}
			if !skip(k.conv) {
				if h, ok := parseValue(k, it.Value()); ok {
					out = append(out, h)
				}
			}
			if k.conv == ^uint64(0) {
				return
			}
			ok = it.SeekGE(qkey{conv: k.conv + 1}.append(p))
		}
	}
	scan(from, 0, false)
	if from > 0 && len(out) < limit {
		scan(0, from, true)
	}
	return out, it.Close()
}

// get re-reads a head: a scan's snapshot may hold one delivered (or
// retried) since. ok is false once it is gone.
func (q *queue) get(name string, k qkey) (head, bool, error) {
	v, c, err := q.db.Get(k.append(prefix('q', name)))
	if errors.Is(err, cpebble.ErrNotFound) {
		return head{}, false, nil
	}
	if err != nil {
		return head{}, false, err
	}
	defer c.Close()
	h, ok := parseValue(k, v)
	return h, ok, nil
}

func (q *queue) done(name string, k qkey) error {
	return q.db.Delete(k.append(prefix('q', name)), cpebble.NoSync)
}

func (q *queue) failed(name string, h head) error {
	v := binary.BigEndian.AppendUint32(make([]byte, 0, valueHeader+len(h.body)), uint32(h.attempts))
	v = binary.BigEndian.AppendUint64(v, uint64(h.queued.UnixMilli()))
	return q.db.Set(h.key.append(prefix('q', name)), append(v, h.body...), cpebble.NoSync)
}

// bury moves an event to the dead letters.
func (q *queue) bury(name string, h head, cause string) error {
	rec, err := json.Marshal(deadRecord{Attempts: h.attempts, Error: cause, At: time.Now().UnixMilli(), Event: h.body})
	if err != nil {
		return err
	}
	b := q.db.NewBatch()
	defer b.Close()
	if err := b.Delete(h.key.append(prefix('q', name)), nil); err != nil {
		return err
	}
	if err := b.Set(h.key.append(prefix('d', name)), rec, nil); err != nil {
		return err
	}
	return b.Commit(cpebble.Sync)
}

// count is the number of keys under kind/name.
func (q *queue) count(kind byte, name string) (int, error) {
	p := prefix(kind, name)
	upper := prefix(kind, name)
	upper[len(upper)-1] = 1
	it, err := q.db.NewIter(&cpebble.IterOptions{LowerBound: p, UpperBound: upper})
	if err != nil {
		return 0, err
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n, it.Close()
}

// dead returns the dead letters of endpoint name.
func (q *queue) dead(name string) ([]deadRecord, error) {
	p := prefix('d', name)
	upper := prefix('d', name)
	upper[len(upper)-1] = 1
	it, err := q.db.NewIter(&cpebble.IterOptions{LowerBound: p, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	var out []deadRecord
	for ok := it.First(); ok; ok = it.Next() {
		var r deadRecord
		if err := json.Unmarshal(it.Value(), &r); err == nil {
			out = append(out, r)
		}
	}
	return out, it.Close()
}

// pebbleLog routes pebble's printf-style log into slog.
type pebbleLog struct{ l *slog.Logger }

func (p pebbleLog) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "webhooks")
}

func (p pebbleLog) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "webhooks")
}

func (p pebbleLog) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "webhooks")
	panic(fmt.Sprintf(format, args...))
}
