// Package jetstream is the webhook queue of cluster mode (hooks.Queue):
// JetStream streams shared by every chat process.
//
// An event for endpoint E of a conversation in partition p is a message
// of the work-queue stream <NS>_HOOKS on subject <ns>.hooks.E.p, published
// by the fan-out that produced it (deduplicated by JetStream on the
// event's id within its duplicate window). The owner of partition p
// (lease.Owner) delivers that subject: while it holds the partition it
// serves one lane per endpoint (hooks.Lane); taking the partition, it
// deletes any consumer left on it (by a dead or former owner) and creates
// its own, which starts at the first event nobody acknowledged, in publish
// order. So a chat process that dies strands nothing: the next owner of
// each of its partitions delivers what it left, after the lease moves. A
// lane whose consumer another process deleted is lost (Err), and one
// whose partition is released ends with its context.
//
// A lane holds at most Hold events ahead of delivery, sorted per
// conversation in (seq, type) order in memory; an event counts as queued
// (hooks.Head.Queued) from when this process took it, so events taken over
// from another process also wait for the rest of the batch the stream
// hands out. An event is acknowledged, and so removed, only once Done or
// buried in the dead-letter stream <NS>_HOOKS_DEAD (subject
// <ns>.hooksdead.E, each message a hooks.DeadLetter as JSON). Attempts
// are counted by the process delivering: they start again at 1 when the
// partition changes owner.
//
// Queue is safe for concurrent use; it passes internal/hooks/hookstest.
package jetstream

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
	njs "github.com/nats-io/nats.go/jetstream"

	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/webhook"
)

// Hold is how many events of one partition and endpoint a process takes
// ahead of delivery (the consumer's max ack pending).
const Hold = 256

// Owner is what the queue needs of the partition leases (lease.Owner).
type Owner interface {
	Partitions() int
	Holds(p int) bool
	Watch(f func(p int, held bool))
}

// Config of a JetStream queue.
type Config struct {
	NATS      *natsio.Conn // the caller's
	Namespace string       // the deployment's NATS namespace
	Replicas  int          // of both streams (default 1)
	Owner     Owner
	// Node names this process in its consumers' names.
	Node string
	// MaxAge drops events (and dead letters) older than this (default 7
	// days).
	MaxAge time.Duration
	// AckWait is how long an event may stay held unacknowledged before
	// the server hands it out again (the copy joins the one held): at
	// least the longest wait between attempts
	// (hooks.Config.RedeliverAfter). Default one minute.
	AckWait time.Duration
	Logger  *slog.Logger
}

// Message headers of a queued event.
const (
	hdrConv = "Parley-Conv"
	hdrSeq  = "Parley-Seq"
	hdrType = "Parley-Type"
)

// Queue keeps webhook events in JetStream streams.
type Queue struct {
	js      njs.JetStream
	cfg     Config
	stream  string
	dead    string
	nonce   string
	stats   atomic.Pointer[streamCounts]
	statsMu sync.Mutex

	mu        sync.Mutex
	ctx       context.Context // Serve's; nil before Serve
	endpoints []string
	deliver   func(context.Context, string, hooks.Lane)
	parts     map[int]context.CancelFunc
	wg        sync.WaitGroup
}

var _ hooks.Queue = (*Queue)(nil)

type streamCounts struct {
	at            time.Time
	backlog, dead map[string]int64
}

func (q *Queue) subject(ep string, p int) string {
	return q.cfg.Namespace + ".hooks." + ep + "." + strconv.Itoa(p)
}
func (q *Queue) deadSubject(ep string) string { return q.cfg.Namespace + ".hooksdead." + ep }
func consumerPrefix(ep string, p int) string  { return "hooks_" + ep + "_" + strconv.Itoa(p) + "_" }

// Open creates (or updates) the streams.
func Open(ctx context.Context, c Config) (*Queue, error) {
	if c.NATS == nil || c.Owner == nil || c.Namespace == "" {
		return nil, errors.New("webhooks: jetstream: the queue needs NATS, a namespace and the partition owner")
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 7 * 24 * time.Hour
	}
	if c.AckWait <= 0 {
		c.AckWait = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := njs.New(c.NATS)
	if err != nil {
		return nil, fmt.Errorf("webhooks: jetstream: %w", err)
	}
	base := strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(c.Namespace)) + "_HOOKS"
	q := &Queue{js: js, cfg: c, stream: base, dead: base + "_DEAD", parts: map[int]context.CancelFunc{},
		nonce: strings.NewReplacer(".", "_").Replace(c.Node) + "_" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	if _, err := js.CreateOrUpdateStream(ctx, njs.StreamConfig{
		Name: q.stream, Subjects: []string{c.Namespace + ".hooks.>"}, Retention: njs.WorkQueuePolicy,
		Storage: njs.FileStorage, Replicas: c.Replicas, MaxAge: c.MaxAge, Duplicates: 2 * time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("webhooks: jetstream: stream %s: %w", q.stream, err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, njs.StreamConfig{
		Name: q.dead, Subjects: []string{c.Namespace + ".hooksdead.>"}, Storage: njs.FileStorage,
		Replicas: c.Replicas, MaxAge: c.MaxAge,
	}); err != nil {
		return nil, fmt.Errorf("webhooks: jetstream: stream %s: %w", q.dead, err)
	}
	return q, nil
}

// Put publishes evs and waits until the stream has them all.
func (q *Queue) Put(ctx context.Context, evs []hooks.Event) error {
	if !q.js.Conn().IsConnected() {
		return errors.New("webhooks: jetstream: nats is disconnected")
	}
	n := q.cfg.Owner.Partitions()
	futures := make([]njs.PubAckFuture, 0, len(evs))
	for _, ev := range evs {
		m := natsio.NewMsg(q.subject(ev.Endpoint, lease.Partition(ev.Conv, n)))
		m.Data = ev.Body
		m.Header.Set(hdrConv, strconv.FormatUint(ev.Conv, 10))
		m.Header.Set(hdrSeq, strconv.FormatUint(ev.Seq, 10))
		m.Header.Set(hdrType, strconv.Itoa(int(ev.Type)))
		f, err := q.js.PublishMsgAsync(m, njs.WithMsgID(ev.Endpoint+"."+webhook.ID(ev.Conv, ev.Seq, webhook.Types[ev.Type])))
		if err != nil {
			return fmt.Errorf("webhooks: jetstream: %w", err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("webhooks: jetstream: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// PutDead stores d, the dead letter of endpoint's event k from another
// queue (parley migrate --from copies an embedded node's), in the
// dead-letter stream. It is published under a message id of k's, so a copy
// published again within the stream's duplicate window (two minutes) is
// stored once.
func (q *Queue) PutDead(ctx context.Context, endpoint string, k hooks.Key, d hooks.DeadLetter) error {
	if int(k.Type) >= len(webhook.Types) {
		return fmt.Errorf("webhooks: jetstream: event type %d", k.Type)
	}
	rec, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("webhooks: jetstream: %w", err)
	}
	if _, err := q.js.Publish(ctx, q.deadSubject(endpoint), rec,
		njs.WithMsgID("dead."+endpoint+"."+webhook.ID(k.Conv, k.Seq, webhook.Types[k.Type]))); err != nil {
		return fmt.Errorf("webhooks: jetstream: %w", err)
	}
	return nil
}

// Serve delivers the partitions this process holds until ctx ends: one
// lane per endpoint and held partition.
func (q *Queue) Serve(ctx context.Context, endpoints []string, deliver func(context.Context, string, hooks.Lane)) {
	q.mu.Lock()
	q.ctx, q.endpoints, q.deliver = ctx, endpoints, deliver
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
func (q *Queue) update(p int, _ bool) {
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
		for _, ep := range q.endpoints {
			q.wg.Go(func() { q.servePartition(ctx, ep, p) })
		}
	case !held && running:
		stop()
		delete(q.parts, p)
	}
}

// servePartition runs the deliverer on endpoint ep's lane of partition p,
// opening it again when it is lost or fails, until ctx ends.
func (q *Queue) servePartition(ctx context.Context, ep string, p int) {
	for backoff := 100 * time.Millisecond; ctx.Err() == nil; backoff = min(2*backoff, 5*time.Second) {
		l, err := q.openLane(ctx, ep, p)
		if err == nil {
			q.deliver(ctx, ep, l)
			l.cc.Stop()
			err = l.Err()
		}
		if ctx.Err() != nil {
			return
		}
		q.cfg.Logger.Warn("webhooks: delivery of a partition stopped; restarting", "endpoint", ep, "partition", p, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
}

// takeOver deletes the consumers of (ep, p) other processes left and
// creates this one's.
func (q *Queue) takeOver(ctx context.Context, ep string, p int) (njs.Consumer, error) {
	s, err := q.js.Stream(ctx, q.stream)
	if err != nil {
		return nil, err
	}
	prefix := consumerPrefix(ep, p)
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
		if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, njs.ErrConsumerNotFound) {
			return nil, err
		}
	}
	return s.CreateConsumer(ctx, njs.ConsumerConfig{
		Durable:       prefix + q.nonce,
		FilterSubject: q.subject(ep, p),
		DeliverPolicy: njs.DeliverAllPolicy,
		AckPolicy:     njs.AckExplicitPolicy,
		AckWait:       q.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: Hold,
		// A consumer whose process died without a successor (the whole
		// chat tier gone) is removed after a day; its events stay.
		InactiveThreshold: 24 * time.Hour,
	})
}

// event is one held event: the message(s) carrying it (a copy published
// again, or handed out again, joins the first).
type event struct {
	key      hooks.Key
	body     []byte
	taken    time.Time
	attempts int
	msgs     []njs.Msg
}

// lane is endpoint ep's events of partition p, held in memory.
type lane struct {
	q    *Queue
	ep   string
	cc   njs.ConsumeContext
	wake chan struct{}
	lost atomic.Bool

	mu    sync.Mutex
	convs map[uint64][]*event // in (seq, type) order
}

var errLost = errors.New("webhooks: jetstream: the consumer is gone (another process took the partition)")

// openLane takes the partition's consumer over and starts taking its
// events.
func (q *Queue) openLane(ctx context.Context, ep string, p int) (*lane, error) {
	if !q.cfg.Owner.Holds(p) {
		return nil, errors.New("the partition is not held")
	}
	cons, err := q.takeOver(ctx, ep, p)
	if err != nil {
		return nil, fmt.Errorf("take over: %w", err)
	}
	l := &lane{q: q, ep: ep, wake: make(chan struct{}, 1), convs: map[uint64][]*event{}}
	l.cc, err = cons.Consume(l.take, njs.PullMaxMessages(Hold), njs.ConsumeErrHandler(func(_ njs.ConsumeContext, err error) {
		q.cfg.Logger.Debug("webhooks: consumer", "endpoint", ep, "partition", p, "err", err)
		if errors.Is(err, njs.ErrConsumerDeleted) || errors.Is(err, njs.ErrConsumerNotFound) {
			// Another process took the partition (or the consumer was
			// removed): the owner's watch serves it again if this
			// process still holds the partition.
			l.lost.Store(true)
			l.poke()
		}
	}))
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	return l, nil
}

func (l *lane) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// take holds a message the consumer hands out.
func (l *lane) take(m njs.Msg) {
	k, ok := headerKey(m.Headers())
	if !ok {
		l.q.cfg.Logger.Error("webhooks: undecodable queued event; dropped", "subject", m.Subject())
		_ = m.Term()
		return
	}
	l.mu.Lock()
	evs := l.convs[k.Conv]
	i, found := slices.BinarySearchFunc(evs, k, func(e *event, k hooks.Key) int {
		switch {
		case e.key.Less(k):
			return -1
		case k.Less(e.key):
			return 1
		}
		return 0
	})
	if found {
		evs[i].msgs = append(evs[i].msgs, m)
	} else {
		l.convs[k.Conv] = slices.Insert(evs, i, &event{key: k, body: m.Data(), taken: time.Now(), msgs: []njs.Msg{m}})
	}
	l.mu.Unlock()
	l.poke()
}

// headerKey reads an event's key from the headers Put wrote.
func headerKey(h natsio.Header) (hooks.Key, bool) {
	conv, err1 := strconv.ParseUint(h.Get(hdrConv), 10, 64)
	seq, err2 := strconv.ParseUint(h.Get(hdrSeq), 10, 64)
	typ, err3 := strconv.Atoi(h.Get(hdrType))
	if err1 != nil || err2 != nil || err3 != nil || typ < 0 || typ >= len(webhook.Types) {
		return hooks.Key{}, false
	}
	return hooks.Key{Conv: conv, Seq: seq, Type: uint8(typ)}, true
}

// Heads returns the held conversations' first events in conversation
// order from conversation from, wrapping around.
func (l *lane) Heads(_ context.Context, from uint64, limit int, skip func(conv uint64) bool) ([]hooks.Head, error) {
	l.mu.Lock()
	heads := make([]hooks.Head, 0, len(l.convs))
	for _, evs := range l.convs {
		e := evs[0]
		heads = append(heads, hooks.Head{Key: e.key, Body: e.body, Attempts: e.attempts, Queued: e.taken, More: len(evs) > 1})
	}
	l.mu.Unlock()
	slices.SortFunc(heads, func(a, b hooks.Head) int {
		// Conversations from `from` on first, then the ones before.
		if (a.Conv >= from) != (b.Conv >= from) {
			if a.Conv >= from {
				return -1
			}
			return 1
		}
		switch {
		case a.Conv < b.Conv:
			return -1
		case a.Conv > b.Conv:
			return 1
		}
		return 0
	})
	out := heads[:0]
	for _, h := range heads {
		if len(out) == limit {
			break
		}
		if !skip(h.Conv) {
			out = append(out, h)
		}
	}
	return out, nil
}

// find returns the held event of key k, nil if none.
func (l *lane) find(k hooks.Key) *event {
	for _, e := range l.convs[k.Conv] {
		if e.key == k {
			return e
		}
	}
	return nil
}

// finish acknowledges h's messages, then forgets it.
func (l *lane) finish(ctx context.Context, h hooks.Head) {
	l.mu.Lock()
	e := l.find(h.Key)
	var msgs []njs.Msg
	if e != nil {
		msgs = slices.Clone(e.msgs)
	}
	l.mu.Unlock()
	if e == nil {
		return
	}
	for _, m := range msgs {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := m.DoubleAck(actx); err != nil {
			l.q.cfg.Logger.Warn("webhooks: acknowledging a finished event failed; it may be sent again", "endpoint", l.ep, "err", err)
		}
		cancel()
	}
	l.mu.Lock()
	// An event taken late may have been put before e meanwhile: remove e
	// itself.
	evs := slices.DeleteFunc(l.convs[h.Conv], func(x *event) bool { return x == e })
	if len(evs) == 0 {
		delete(l.convs, h.Conv)
	} else {
		l.convs[h.Conv] = evs
	}
	l.mu.Unlock()
}

// Done acknowledges a delivered event.
func (l *lane) Done(ctx context.Context, h hooks.Head) error {
	l.finish(ctx, h)
	return nil
}

// Retry counts the failed attempt in memory.
func (l *lane) Retry(_ context.Context, h hooks.Head) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.find(h.Key); e != nil {
		e.attempts = h.Attempts
	}
	return nil
}

// Bury publishes the dead letter, then acknowledges the event.
func (l *lane) Bury(ctx context.Context, h hooks.Head, cause string) error {
	rec, err := json.Marshal(hooks.DeadLetter{Attempts: h.Attempts, Error: cause, At: time.Now().UnixMilli(), Event: h.Body})
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = l.q.js.Publish(pctx, l.q.deadSubject(l.ep), rec)
	cancel()
	if err != nil {
		return fmt.Errorf("webhooks: jetstream: %w", err)
	}
	l.finish(ctx, h)
	return nil
}

func (l *lane) Changed() <-chan struct{} { return l.wake }

func (l *lane) Err() error {
	if l.lost.Load() {
		return errLost
	}
	return nil
}

// Stats reads the shared streams' counts for endpoint (the same figures on
// every process).
func (q *Queue) Stats(endpoint string) (backlog, dead int64) {
	c := q.counts()
	return c.backlog[endpoint], c.dead[endpoint]
}

// counts reads the streams' per-endpoint counts (cached for a second:
// metrics scrapes ask per endpoint and per figure).
func (q *Queue) counts() *streamCounts {
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
	out := &streamCounts{at: time.Now(), backlog: map[string]int64{}, dead: map[string]int64{}}
	read := func(stream, filter string, into map[string]int64, name func(subject string) string) {
		s, err := q.js.Stream(ctx, stream)
		if err != nil {
			return
		}
		info, err := s.Info(ctx, njs.WithSubjectFilter(filter))
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

// Dead reads the endpoint's dead letters.
func (q *Queue) Dead(ctx context.Context, endpoint string) ([]hooks.DeadLetter, error) {
	cons, err := q.js.OrderedConsumer(ctx, q.dead, njs.OrderedConsumerConfig{FilterSubjects: []string{q.deadSubject(endpoint)}})
	if err != nil {
		return nil, fmt.Errorf("webhooks: jetstream: dead: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("webhooks: jetstream: dead: %w", err)
	}
	n := int(info.NumPending)
	var out []hooks.DeadLetter
	for len(out) < n {
		batch, err := cons.Fetch(min(n-len(out), 256), njs.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("webhooks: jetstream: dead: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var r hooks.DeadLetter
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

// Close does nothing: the caller owns the connection.
func (q *Queue) Close() error { return nil }
