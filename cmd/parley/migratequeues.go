package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	natsio "github.com/nats-io/nats.go"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/hooks"
	hjetstream "github.com/parley-im/parley/internal/hooks/jetstream"
	hpebble "github.com/parley-im/parley/internal/hooks/pebble"
	ljetstream "github.com/parley-im/parley/internal/ledger/jetstream"
	lpebble "github.com/parley-im/parley/internal/ledger/pebble"
	"github.com/parley-im/parley/internal/server"
)

// The durable queues of an embedded node, copied into the cluster's
// JetStream streams after the store: the webhook queue (DATA_DIR/webhooks),
// the push queue (DATA_DIR/push) and the compensation ledger
// (DATA_DIR/ledger), each with its dead letters. The source is only read.
//
// Resuming: the checkpoint holds, per queue, the cursor of the last event
// copied, saved once JetStream has acknowledged a whole page; a run killed
// in the middle of a page publishes that page again. Every event is
// published under a stable JetStream message id (Nats-Msg-Id) — a webhook
// or push event under the very id the cluster's fan-out gives it, a ledger
// task under the source's id of it — so JetStream drops the copies of a
// page published again within the streams' duplicate window (two
// minutes). The checkpoint bounds what a run again can publish twice to
// one page; the message ids make that nothing when it comes within the
// window. A later run can enqueue again the events of the page in flight
// at the kill (at most queuePage): webhook and push delivery are at least
// once anyway (a receiver tells a repeat by Parley-Webhook-Id) and ledger
// tasks are idempotent.
//
// What the cluster's engines do not keep is not copied: a webhook or push
// event's attempts and queued-at (JetStream counts attempts per owning
// process and settles from when the owner took the event), a ledger task's
// attempts and due time (JetStream counts deliveries; the task is due at
// once in the cluster).

// queuePage is how many events a queue's page holds: the most a run again
// long after a kill may enqueue twice.
var queuePage = 100

// queues are the source's queues and their targets; a nil source is
// absent or empty, and has nothing to copy.
type queues struct {
	hooks, push        *hpebble.Queue
	hooksDst, pushDst  *hjetstream.Queue
	ledger             *lpebble.Ledger
	ledgerDst          *ljetstream.Ledger
	hookN, pushN, ledN uint64 // the bar's totals
	idPrefix           string // of the ledger copies' message ids
	closeConn          func()
}

// publishOnly is the partition owner of a queue migrate only publishes
// into: it holds no partition (Serve is never called), and maps
// conversations to the cluster's partitions.
type publishOnly int

func (n publishOnly) Partitions() int         { return int(n) }
func (publishOnly) Holds(int) bool            { return false }
func (publishOnly) Watch(func(p int, _ bool)) {}

var _ hjetstream.Owner = publishOnly(0)

// openQueues opens the source's queues that hold anything and, if any
// does, their streams on the cluster's NATS. It returns nil when there is
// nothing to copy.
func openQueues(ctx context.Context, from string, cfg config.Config) (*queues, error) {
	q := &queues{closeConn: func() {}}
	ok := false
	defer func() {
		if !ok {
			q.close()
		}
	}()
	var err error
	if q.hooks, q.hookN, err = openHookSource(ctx, filepath.Join(from, "webhooks")); err != nil {
		return nil, fmt.Errorf("webhook queue: %w", err)
	}
	if q.push, q.pushN, err = openHookSource(ctx, filepath.Join(from, "push")); err != nil {
		return nil, fmt.Errorf("push queue: %w", err)
	}
	if q.ledger, q.ledN, err = openLedgerSource(ctx, filepath.Join(from, "ledger")); err != nil {
		return nil, fmt.Errorf("compensation ledger: %w", err)
	}
	if q.hooks == nil && q.push == nil && q.ledger == nil {
		return nil, nil
	}
	c := cfg.Cluster
	if c.Partitions < 1 || c.Namespace == "" {
		return nil, fmt.Errorf("cluster.partitions (%d) and cluster.namespace (%q) must be the cluster's", c.Partitions, c.Namespace)
	}
	if c.NATS == "" {
		return nil, fmt.Errorf("cluster.nats is not set: %s holds %d webhook events, %d push events and %d compensation tasks to copy into the cluster's JetStream",
			from, q.hookN, q.pushN, q.ledN)
	}
	nc, err := pnats.Connect(ctx, pnats.ConnConfig{URL: c.NATS, Name: "parley-migrate"})
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	q.closeConn = nc.Close
	if err := q.openTargets(ctx, nc, c, from); err != nil {
		return nil, err
	}
	ok = true
	return q, nil
}

// openTargets opens the streams of the queues the source has, as the
// cluster's chat processes do (the same names, subjects and replicas).
func (q *queues) openTargets(ctx context.Context, nc *natsio.Conn, c config.Cluster, from string) error {
	var err error
	owner := publishOnly(c.Partitions)
	if q.hooks != nil {
		if q.hooksDst, err = hjetstream.Open(ctx, hjetstream.Config{NATS: nc, Namespace: c.Namespace, Replicas: c.JetStreamReplicas, Owner: owner, Node: "migrate"}); err != nil {
			return fmt.Errorf("webhook queue: %w", err)
		}
	}
	if q.push != nil {
		if q.pushDst, err = hjetstream.Open(ctx, hjetstream.Config{NATS: nc, Namespace: server.PushNamespace(c.Namespace), Replicas: c.JetStreamReplicas, Owner: owner, Node: "migrate"}); err != nil {
			return fmt.Errorf("push queue: %w", err)
		}
	}
	if q.ledger != nil {
		if q.ledgerDst, err = ljetstream.Open(ctx, nc, server.LedgerConfig(c.Namespace, c.JetStreamReplicas)); err != nil {
			return fmt.Errorf("compensation ledger: %w", err)
		}
		// The source's task ids are its own: the node's directory tells
		// its copies apart from another node's moved into the same
		// cluster.
		abs, err := filepath.Abs(from)
		if err != nil {
			return err
		}
		sum := sha256.Sum256([]byte(abs))
		q.idPrefix = "migrate." + hex.EncodeToString(sum[:6]) + "."
	}
	return nil
}

// close closes the sources and the NATS connection.
func (q *queues) close() {
	if q == nil {
		return
	}
	if q.hooks != nil {
		q.hooks.Close()
	}
	if q.push != nil {
		q.push.Close()
	}
	if q.ledger != nil {
		q.ledger.Close()
	}
	q.closeConn()
}

// openHookSource opens the webhook or push queue at dir and counts what
// it holds: nil when dir is absent (never created by the node) or empty.
func openHookSource(ctx context.Context, dir string) (*hpebble.Queue, uint64, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	q, err := hpebble.Open(hpebble.Config{Dir: dir})
	if err != nil {
		return nil, 0, fmt.Errorf("%s (is its node stopped?): %w", dir, err)
	}
	var n uint64
	for after := []byte(nil); ; {
		evs, err := q.Export(ctx, after, 1000)
		if err != nil {
			q.Close()
			return nil, 0, err
		}
		if len(evs) == 0 {
			break
		}
		n += uint64(len(evs))
		after = evs[len(evs)-1].Cursor
	}
	if n == 0 {
		q.Close()
		return nil, 0, nil
	}
	return q, n, nil
}

// openLedgerSource opens the compensation ledger at dir and counts its
// tasks: nil when dir is absent or the ledger empty.
func openLedgerSource(ctx context.Context, dir string) (*lpebble.Ledger, uint64, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	l, err := lpebble.Open(lpebble.Config{Dir: dir})
	if err != nil {
		return nil, 0, fmt.Errorf("%s (is its node stopped?): %w", dir, err)
	}
	var n uint64
	for after := []byte(nil); ; {
		ts, err := l.Export(ctx, after, 1000)
		if err != nil {
			l.Close()
			return nil, 0, err
		}
		if len(ts) == 0 {
			break
		}
		n += uint64(len(ts))
		after = ts[len(ts)-1].Cursor
	}
	if n == 0 {
		l.Close()
		return nil, 0, nil
	}
	return l, n, nil
}

// copyHooks copies a webhook or push queue page by page from its
// progress's cursor, recording each page's last cursor in the checkpoint.
func (m *migration) copyHooks(ctx context.Context, what string, src *hpebble.Queue, dst *hjetstream.Queue, total uint64, pr *queueProgress) error {
	m.bar.what = fmt.Sprintf("(%s: %d/%d)", what, pr.Copied, total)
	m.bar.draw(true)
	for {
		evs, err := src.Export(ctx, pr.Cursor, queuePage)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return m.step(func() error { pr.Done = true; return nil })
		}
		pctx, cancel := context.WithTimeout(ctx, queueWait)
		err = putPage(pctx, dst, evs)
		cancel()
		if err != nil {
			return err
		}
		if err := m.step(func() error { pr.Cursor, pr.Copied = evs[len(evs)-1].Cursor, pr.Copied+uint64(len(evs)); return nil }); err != nil {
			return err
		}
		m.bar.what = fmt.Sprintf("(%s: %d/%d)", what, pr.Copied, total)
		m.bar.draw(false)
	}
}

// putPage publishes a page's dead letters, then its queued events.
func putPage(ctx context.Context, dst *hjetstream.Queue, evs []hpebble.Exported) error {
	var put []hooks.Event
	for _, e := range evs {
		if e.Dead == nil {
			put = append(put, hooks.Event{Endpoint: e.Endpoint, Key: e.Head.Key, Body: e.Head.Body})
			continue
		}
		if err := dst.PutDead(ctx, e.Endpoint, e.Head.Key, *e.Dead); err != nil {
			return err
		}
	}
	if len(put) == 0 {
		return nil
	}
	return dst.Put(ctx, put)
}

// copyLedger copies the compensation ledger's tasks page by page from the
// checkpoint's cursor.
func (m *migration) copyLedger(ctx context.Context) error {
	q, pr := m.queues, &m.cp.Ledger
	m.bar.what = fmt.Sprintf("(compensation ledger: %d/%d)", pr.Copied, q.ledN)
	m.bar.draw(true)
	for {
		ts, err := q.ledger.Export(ctx, pr.Cursor, queuePage)
		if err != nil {
			return err
		}
		if len(ts) == 0 {
			return m.step(func() error { pr.Done = true; return nil })
		}
		for _, t := range ts {
			id := q.idPrefix + "task." + strconv.FormatUint(t.Task.ID, 10)
			if t.Dead {
				id = q.idPrefix + "dead." + strconv.FormatUint(t.Task.ID, 10)
			}
			pctx, cancel := context.WithTimeout(ctx, queueWait)
			err := q.ledgerDst.Copy(pctx, t.Task, t.Dead, id)
			cancel()
			if err != nil {
				return fmt.Errorf("task %d: %w", t.Task.ID, err)
			}
		}
		if err := m.step(func() error { pr.Cursor, pr.Copied = ts[len(ts)-1].Cursor, pr.Copied+uint64(len(ts)); return nil }); err != nil {
			return err
		}
		m.bar.what = fmt.Sprintf("(compensation ledger: %d/%d)", pr.Copied, q.ledN)
		m.bar.draw(false)
	}
}

// copyQueues runs the queues' phases the checkpoint has not finished.
func (m *migration) copyQueues(ctx context.Context) error {
	q := m.queues
	if q == nil {
		return nil
	}
	if q.hooks != nil && !m.cp.Webhooks.Done {
		if err := m.copyHooks(ctx, "webhook queue", q.hooks, q.hooksDst, q.hookN, &m.cp.Webhooks); err != nil {
			return fmt.Errorf("webhook queue: %w", err)
		}
	}
	if q.push != nil && !m.cp.PushQueue.Done {
		if err := m.copyHooks(ctx, "push queue", q.push, q.pushDst, q.pushN, &m.cp.PushQueue); err != nil {
			return fmt.Errorf("push queue: %w", err)
		}
	}
	if q.ledger != nil && !m.cp.Ledger.Done {
		if err := m.copyLedger(ctx); err != nil {
			return fmt.Errorf("compensation ledger: %w", err)
		}
	}
	return nil
}

// queueWait bounds the publishing of a page (or a task): JetStream
// acknowledges in milliseconds, unless the cluster's NATS is down.
const queueWait = 30 * time.Second
