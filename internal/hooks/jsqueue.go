package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/webhook"
)

// The cluster-mode queue: JetStream, shared by every chat process.
//
// An event for endpoint E of a conversation in partition p is a message
// of the work-queue stream <NS>_HOOKS on subject <ns>.hooks.E.p, published
// by the fan-out that produced it (deduplicated by JetStream on the
// event's id within its duplicate window). The owner of partition p
// (lease.Owner) delivers that subject: when it takes the partition it
// deletes any consumer left on it (by a dead or former owner) and creates
// its own, which starts at the first event nobody acknowledged, in publish
// order. So a chat process that dies strands nothing: the next owner of
// each of its partitions delivers what it left, after the lease moves.
//
// Delivery keeps the embedded queue's rules: per conversation one event in
// flight, the rest waiting in (seq, type) order in memory (at most
// jsHold per partition and endpoint are taken from the stream ahead of
// delivery), each due Settle after this process took it so that two
// fan-outs that finished out of seq order are put back in order; failed attempts
// retried with exponential backoff while the conversation's later events
// wait; after MaxAttempts the event moves to the dead-letter stream
// <NS>_HOOKS_DEAD (subject <ns>.hooksdead.E). An event is acknowledged,
// and so removed, only once delivered or dead-lettered.
//
// Attempts are counted by the process delivering: they start again at 1
// when the partition changes owner.

// jsHold is how many events of one partition and endpoint a process takes
// ahead of delivery (the consumer's max ack pending).
const jsHold = 256

// Owner is what the cluster-mode queue needs of the partition leases
// (lease.Owner).
type Owner interface {
	Partitions() int
	Holds(p int) bool
	Watch(f func(p int, held bool))
}

// Cluster selects the JetStream queue (cluster mode).
type Cluster struct {
	NATS      *natsio.Conn
	Namespace string // the deployment's NATS namespace
	Replicas  int    // of both streams (default 1)
	Owner     Owner
	// Node names this process in its consumers' names.
	Node string
	// MaxAge drops events (and dead letters) older than this (default 7
	// days).
	MaxAge time.Duration
}

// Message headers of a queued event.
const (
	hdrConv = "Parley-Conv"
	hdrSeq  = "Parley-Seq"
	hdrType = "Parley-Type"
)

type jsQueue struct {
	h       *Hooks
	js      jetstream.JetStream
	cfg     Cluster
	stream  string
	dead    string
	log     *slog.Logger
	nonce   string
	wait    time.Duration // consumers' ack wait
	stats   atomic.Pointer[jsCounts]
	statsMu sync.Mutex

	mu    sync.Mutex
	ctx   context.Context // Run's; nil before Run
	parts map[int]context.CancelFunc
	wg    sync.WaitGroup
}

type jsCounts struct {
	at            time.Time
	backlog, dead map[string]int64
}

func (q *jsQueue) subject(ep string, p int) string {
	return q.cfg.Namespace + ".hooks." + ep + "." + strconv.Itoa(p)
}
func (q *jsQueue) deadSubject(ep string) string { return q.cfg.Namespace + ".hooksdead." + ep }
func consumerPrefix(ep string, p int) string    { return "hooks_" + ep + "_" + strconv.Itoa(p) + "_" }

func newJSQueue(ctx context.Context, h *Hooks, c Cluster) (*jsQueue, error) {
	if c.NATS == nil || c.Owner == nil || c.Namespace == "" {
		return nil, errors.New("webhooks: the cluster queue needs NATS, a namespace and the partition owner")
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 7 * 24 * time.Hour
	}
	js, err := jetstream.New(c.NATS)
	if err != nil {
		return nil, fmt.Errorf("webhooks: jetstream: %w", err)
	}
	base := strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(c.Namespace)) + "_HOOKS"
	q := &jsQueue{h: h, js: js, cfg: c, stream: base, dead: base + "_DEAD", log: h.log, parts: map[int]context.CancelFunc{},
		nonce: strings.NewReplacer(".", "_").Replace(c.Node) + "_" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	// An event waits at most the whole retry span of its conversation's
	// earlier events; past the ack wait the server hands it out again, and
	// the copy joins the one already held.
	q.wait = max(time.Minute, 2*h.cfg.MaxBackoff)
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: q.stream, Subjects: []string{c.Namespace + ".hooks.>"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Replicas: c.Replicas, MaxAge: c.MaxAge, Duplicates: 2 * time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("webhooks: stream %s: %w", q.stream, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: q.dead, Subjects: []string{c.Namespace + ".hooksdead.>"}, Storage: jetstream.FileStorage,
		Replicas: c.Replicas, MaxAge: c.MaxAge,
	}); err != nil {
		return nil, fmt.Errorf("webhooks: stream %s: %w", q.dead, err)
	}
	return q, nil
}

// put publishes items and waits until the stream has them all.
func (q *jsQueue) put(ctx context.Context, items []item) error {
	if !q.js.Conn().IsConnected() {
		return errors.New("nats is disconnected")
	}
	n := q.cfg.Owner.Partitions()
	futures := make([]jetstream.PubAckFuture, 0, len(items))
	for _, it := range items {
		name := q.h.names[it.ep]
		typ := webhook.Types[it.key.typ]
		m := natsio.NewMsg(q.subject(name, lease.Partition(it.key.conv, n)))
		m.Data = it.body
		m.Header.Set(hdrConv, strconv.FormatUint(it.key.conv, 10))
		m.Header.Set(hdrSeq, strconv.FormatUint(it.key.seq, 10))
		m.Header.Set(hdrType, strconv.Itoa(int(it.key.typ)))
		f, err := q.js.PublishMsgAsync(m, jetstream.WithMsgID(name+"."+webhook.ID(it.key.conv, it.key.seq, typ)))
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// run delivers the partitions this process holds until ctx ends.
func (q *jsQueue) run(ctx context.Context) {
	q.mu.Lock()
	q.ctx = ctx
	q.mu.Unlock()
	q.cfg.Owner.Watch(q.update)
	<-ctx.Done()
	q.mu.Lock()
	for p, stop := range q.parts {
		stop()
		delete(q.parts, p)
	}
	q.mu.Unlock()
	q.wg.Wait()
}

// update starts or stops delivering partition p as the owner holds it.
func (q *jsQueue) update(p int, _ bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ctx == nil || q.ctx.Err() != nil {
		return
	}
	held := q.cfg.Owner.Holds(p)
	stop, running := q.parts[p]
	switch {
	case held && !running:
		ctx, cancel := context.WithCancel(q.ctx)
		q.parts[p] = cancel
		q.wg.Go(func() { q.deliverPartition(ctx, p) })
	case !held && running:
		stop()
		delete(q.parts, p)
	}
}

// deliverPartition takes over partition p's consumers (one per endpoint)
// and delivers until ctx ends.
func (q *jsQueue) deliverPartition(ctx context.Context, p int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, ep := range q.h.eps {
		wg.Go(func() {
			for backoff := 100 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, 5*time.Second) {
				err := q.deliverLane(ctx, ep, p)
				if ctx.Err() != nil {
					return
				}
				q.log.Warn("webhooks: delivery of a partition stopped; restarting", "endpoint", ep.Name, "partition", p, "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(backoff):
				}
			}
		})
	}
}

// takeOver deletes the consumers of (ep, p) other processes left and
// creates this one's.
func (q *jsQueue) takeOver(ctx context.Context, ep *endpoint, p int) (jetstream.Consumer, error) {
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return nil, err
	}
	prefix := consumerPrefix(ep.Name, p)
	names := s.ConsumerNames(ctx)
	var old []string
	for name := range names.Name() {
		if strings.HasPrefix(name, prefix) {
			old = append(old, name)
		}
	}
	if err := names.Err(); err != nil {
		return nil, err
	}
	for _, name := range old {
		if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, err
		}
	}
	return s.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       prefix + q.nonce,
		FilterSubject: q.subject(ep.Name, p),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       q.wait,
		MaxDeliver:    -1,
		MaxAckPending: jsHold,
		// A consumer whose process died without a successor (the whole
		// chat tier gone) is removed after a day; its events stay.
		InactiveThreshold: 24 * time.Hour,
	})
}

// jsEvent is one held event: the message(s) carrying it (a copy published
// again, or handed out again, joins the first) and when it is due.
type jsEvent struct {
	key  qkey
	body []byte
	due  time.Time
	msgs []jetstream.Msg
}

type jsConv struct {
	evs      []*jsEvent // in (seq, type) order
	head     *jsEvent   // the event attempts counts
	busy     bool
	until    time.Time
	attempts int
}

func less(a, b qkey) bool { return a.seq < b.seq || a.seq == b.seq && a.typ < b.typ }

// deliverLane delivers endpoint ep's events of partition p.
func (q *jsQueue) deliverLane(ctx context.Context, ep *endpoint, p int) error {
	if !q.cfg.Owner.Holds(p) {
		return errors.New("the partition is not held")
	}
	cons, err := q.takeOver(ctx, ep, p)
	if err != nil {
		return fmt.Errorf("take over: %w", err)
	}
	var (
		mu    sync.Mutex
		convs = map[uint64]*jsConv{}
		wake  = make(chan struct{}, 1)
		wg    sync.WaitGroup
		lost  atomic.Bool
	)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		k, ok := msgKey(m)
		if !ok {
			q.log.Error("webhooks: undecodable queued event; dropped", "subject", m.Subject())
			_ = m.Term()
			return
		}
		mu.Lock()
		c := convs[k.conv]
		if c == nil {
			c = &jsConv{}
			convs[k.conv] = c
		}
		i, found := slices.BinarySearchFunc(c.evs, k, func(e *jsEvent, k qkey) int {
			switch {
			case less(e.key, k):
				return -1
			case less(k, e.key):
				return 1
			}
			return 0
		})
		if found {
			c.evs[i].msgs = append(c.evs[i].msgs, m)
		} else {
			// Due Settle after this process took it: a fresh event waits
			// for a fan-out that finished just after it, and events taken
			// over from another process (all due by their publication)
			// wait for the rest of the batch the stream hands out.
			c.evs = slices.Insert(c.evs, i, &jsEvent{key: k, body: m.Data(), due: time.Now().Add(q.h.settle), msgs: []jetstream.Msg{m}})
		}
		mu.Unlock()
		poke()
	}, jetstream.PullMaxMessages(jsHold), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		q.log.Debug("webhooks: consumer", "endpoint", ep.Name, "partition", p, "err", err)
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			// Another process took the partition (or the consumer was
			// removed): stop; the owner's watch restarts it if this
			// process still holds the partition.
			lost.Store(true)
			poke()
		}
	}))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	defer func() {
		cc.Stop()
		wg.Wait()
	}()
	unsubscribe := ep.listen(poke)
	defer unsubscribe()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := time.Now()
		wait := time.Second
		mu.Lock()
		for conv, c := range convs {
			if len(c.evs) == 0 {
				delete(convs, conv)
				continue
			}
			if c.busy {
				continue
			}
			next := c.evs[0].due
			if c.until.After(next) {
				next = c.until
			}
			if next.After(now) {
				wait = min(wait, next.Sub(now))
				continue
			}
			if !ep.acquire() {
				break // every slot of the endpoint is taken; a finished delivery pokes
			}
			if c.evs[0] != c.head {
				// A new head (the last one finished, or one taken late
				// sorts before it): its own count.
				c.head, c.attempts = c.evs[0], 0
			}
			c.busy = true
			c.attempts++
			ev, attempts := c.evs[0], c.attempts
			wg.Go(func() {
				defer ep.release()
				done := q.attempt(ctx, ep, ev, attempts)
				mu.Lock()
				c.busy = false
				switch {
				case done:
					// An event taken late may have been put before ev
					// while it was in flight: remove ev itself.
					c.evs = slices.DeleteFunc(c.evs, func(e *jsEvent) bool { return e == ev })
					c.head, c.attempts, c.until = nil, 0, time.Time{}
				case ctx.Err() == nil:
					c.until = time.Now().Add(min(q.h.cfg.MinBackoff<<min(attempts-1, 30), q.h.cfg.MaxBackoff))
				}
				mu.Unlock()
				poke()
			})
		}
		mu.Unlock()
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-timer.C:
		}
		if lost.Load() {
			return errors.New("the consumer is gone")
		}
	}
}

func msgKey(m jetstream.Msg) (qkey, bool) { return headerKey(m.Headers()) }

// headerKey reads an event's key from the headers put wrote.
func headerKey(h natsio.Header) (qkey, bool) {
	conv, err1 := strconv.ParseUint(h.Get(hdrConv), 10, 64)
	seq, err2 := strconv.ParseUint(h.Get(hdrSeq), 10, 64)
	typ, err3 := strconv.Atoi(h.Get(hdrType))
	if err1 != nil || err2 != nil || err3 != nil || typ < 0 || typ >= len(webhook.Types) {
		return qkey{}, false
	}
	return qkey{conv: conv, seq: seq, typ: uint8(typ)}, true
}

// attempt posts ev once; it reports whether the event is finished
// (delivered, or moved to the dead letters).
func (q *jsQueue) attempt(ctx context.Context, ep *endpoint, ev *jsEvent, attempts int) bool {
	err := q.h.post(ctx, ep, head{key: ev.key, attempts: attempts, body: ev.body})
	if err != nil && ctx.Err() != nil {
		return false // stopping: the next owner sends it
	}
	ack := func() {
		for _, m := range ev.msgs {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if aerr := m.DoubleAck(actx); aerr != nil {
				q.log.Warn("webhooks: acknowledging a delivered event failed; it may be sent again", "endpoint", ep.Name, "err", aerr)
			}
			cancel()
		}
	}
	switch {
	case err == nil:
		ack()
		ep.backlog.Add(-1)
		ep.delivered.Add(1)
		return true
	case attempts >= q.h.cfg.MaxAttempts:
		ep.failed.Add(1)
		q.log.Error("webhook failed for the last time; moved to the dead letters", "endpoint", ep.Name,
			"conv", ev.key.conv, "seq", ev.key.seq, "type", webhook.Types[ev.key.typ], "attempts", attempts, "err", err)
		rec, merr := json.Marshal(deadRecord{Attempts: attempts, Error: err.Error(), At: time.Now().UnixMilli(), Event: ev.body})
		if merr == nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, merr = q.js.Publish(pctx, q.deadSubject(ep.Name), rec)
			cancel()
		}
		if merr != nil {
			q.log.Error("webhooks: dead-lettering failed; retrying", "endpoint", ep.Name, "err", merr)
			return false
		}
		ack()
		ep.deadN.Add(1)
		return true
	default:
		ep.failed.Add(1)
		q.log.Warn("webhook attempt failed; retrying", "endpoint", ep.Name, "conv", ev.key.conv, "seq", ev.key.seq,
			"type", webhook.Types[ev.key.typ], "attempt", attempts, "err", err)
		return false
	}
}

// counts reads the streams' per-endpoint counts (cached for a second:
// metrics scrapes ask per endpoint and per figure).
func (q *jsQueue) counts() *jsCounts {
	if c := q.stats.Load(); c != nil && time.Since(c.at) < time.Second {
		return c
	}
	q.statsMu.Lock()
	defer q.statsMu.Unlock()
	if c := q.stats.Load(); c != nil && time.Since(c.at) < time.Second {
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out := &jsCounts{at: time.Now(), backlog: map[string]int64{}, dead: map[string]int64{}}
	read := func(stream, filter string, into map[string]int64, name func(subject string) string) {
		s, err := q.js.Stream(ctx, stream)
		if err != nil {
			return
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return
		}
		for subj, n := range info.State.Subjects {
			into[name(subj)] += int64(n)
		}
	}
	ns := q.cfg.Namespace
	read(q.stream, ns+".hooks.>", out.backlog, func(s string) string {
		s = strings.TrimPrefix(s, ns+".hooks.")
		if i := strings.LastIndexByte(s, '.'); i >= 0 {
			s = s[:i]
		}
		return s
	})
	read(q.dead, ns+".hooksdead.>", out.dead, func(s string) string { return strings.TrimPrefix(s, ns+".hooksdead.") })
	q.stats.Store(out)
	return out
}

// deadLetters reads endpoint's dead letters.
func (q *jsQueue) deadLetters(endpoint string) ([]deadRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := q.js.OrderedConsumer(ctx, q.dead, jetstream.OrderedConsumerConfig{FilterSubjects: []string{q.deadSubject(endpoint)}})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	n := int(info.NumPending)
	var out []deadRecord
	for len(out) < n {
		batch, err := cons.Fetch(min(n-len(out), 256), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var r deadRecord
			if json.Unmarshal(m.Data(), &r) == nil {
				out = append(out, r)
			}
		}
		if got == 0 {
			break
		}
	}
	return out, nil
}
