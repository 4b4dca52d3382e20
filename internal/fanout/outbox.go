package fanout

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/internal/settings"
	"github.com/parley-im/parley/internal/store"
)

// outboxStore is what the outbox needs of the store.
type outboxStore interface {
	Pending(ctx context.Context, limit int) ([]store.Pending, error)
	FanoutDone(ctx context.Context, convID uint64, seqs []uint64) error
	Messages(ctx context.Context, convID, from, to uint64, limit int) ([]store.Message, error)
}

// Job is one stored message to fan out.
type Job struct {
	Msg store.Message
	// RowsWritten: the append wrote every member's row already
	// (store.Append.Rows); false for messages read back from the outbox.
	RowsWritten bool
	// Conv is the conversation as the request read it just before the
	// append (kind, members, tier), so the fan-out need not read it
	// again; nil: the fan-out reads it.
	Conv *store.Conversation
	// Members are a direct conversation's two members when the sender
	// knows them (they never change); nil: the fan-out reads them.
	Members []string
	// Leavers are the members that leave a group with this message (its
	// member_removed or member_left event): they receive it, and the
	// online index forgets them right after its pushes, before the next
	// message of the conversation is fanned out, so none after it reaches
	// them (the chat service's Left, after the event's fan-out, is then
	// a repeat). Nil for messages read back from the outbox.
	Leavers []string
	// Reactions are a reaction event's target's counts after it, as the
	// request's append applied it; nil: the fan-out reads them.
	Reactions *[]store.Reaction
}

// handler fans out one message (Fanout.FanOut). An error means the work
// was neither done nor handed to the compensation ledger: the entry stays
// and the conversation is retried after a backoff.
type handler func(ctx context.Context, j Job) error

// Config tunes the outbox. Each field with a yaml tag is a server setting
// under fanout. (package settings). Zero fields take the defaults of
// DefaultConfig.
type Config struct {
	Workers    int           `yaml:"workers" help:"conversations fanned out at once by this process"`
	MaxQueued  int           `yaml:"max_queued" help:"stored messages awaiting fan-out held in memory (more are read back from the store)"`
	Batch      int           `yaml:"batch" help:"messages of one conversation fanned out per turn"`
	Scan       time.Duration `yaml:"scan" help:"interval of the scan of the store's outbox for messages not yet fanned out"`
	ScanLimit  int           `yaml:"scan_limit" help:"outbox entries read per scan"`
	MinBackoff time.Duration `yaml:"min_backoff" help:"first retry delay of a conversation whose fan-out failed"`
	MaxBackoff time.Duration `yaml:"max_backoff" help:"longest retry delay of a conversation whose fan-out failed"`
	// ReactionInterval is the window over which a medium or large group's
	// reaction events are coalesced into one reactions push (reactions.go).
	ReactionInterval time.Duration `yaml:"reaction_interval" help:"a medium or large group's reactions are pushed coalesced, at most once per this interval"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Workers: 16, MaxQueued: 100_000, Batch: 64, Scan: 2 * time.Second, ScanLimit: 10_000,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: 10 * time.Second,
		// Two pushes a second per online member, however many reactions.
		ReactionInterval: 500 * time.Millisecond,
	}
}

// Validate reports every setting the outbox cannot run with, by key.
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.Workers > 0, "workers", "must be positive, got %d", c.Workers)
	p.Check(c.MaxQueued > 0, "max_queued", "must be positive, got %d", c.MaxQueued)
	p.Check(c.Batch > 0, "batch", "must be positive, got %d", c.Batch)
	p.Check(c.Scan > 0, "scan", "must be positive, got %v", c.Scan)
	p.Check(c.ScanLimit > 0, "scan_limit", "must be positive, got %d", c.ScanLimit)
	p.Check(c.MinBackoff > 0, "min_backoff", "must be positive, got %v", c.MinBackoff)
	p.Check(c.ReactionInterval >= 10*time.Millisecond && c.ReactionInterval <= 10*time.Second, "reaction_interval", "must be within 10ms-10s, got %v", c.ReactionInterval)
	p.Check(c.MaxBackoff >= c.MinBackoff, "max_backoff", "must be at least min_backoff (%v), got %v", c.MinBackoff, c.MaxBackoff)
	return p.Err("fanout")
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Workers <= 0 {
		c.Workers = d.Workers
	}
	if c.MaxQueued <= 0 {
		c.MaxQueued = d.MaxQueued
	}
	if c.Batch <= 0 {
		c.Batch = d.Batch
	}
	if c.Scan <= 0 {
		c.Scan = d.Scan
	}
	if c.ScanLimit <= 0 {
		c.ScanLimit = d.ScanLimit
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = d.MinBackoff
	}
	if c.ReactionInterval <= 0 {
		c.ReactionInterval = d.ReactionInterval
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(d.MaxBackoff, c.MinBackoff)
	}
	return c
}

// item is a queued message; without msg it is read from the store.
type item struct {
	seq  uint64
	job  Job
	read bool      // job.Msg must be read from the store
	at   time.Time // when it was queued (after its ACK, or read back by a scan)
}

type convQ struct {
	items   []item    // sorted by seq, no repeats
	busy    bool      // a worker holds the conversation
	since   time.Time // busy: when the oldest item of the worker's batch was queued
	ready   bool      // in the ready list
	fails   int
	waiting bool // a retry timer will make it ready
}

// outbox is the fan-out worker pool: per conversation, one message at a
// time in seq order. Its methods are safe for concurrent use.
type outbox struct {
	cfg Config
	st  outboxStore
	h   handler
	log *slog.Logger

	// quiet is held shared by every turn, from the handler's first
	// effect to the clearing of the entries; Fanout.Quiesce takes it
	// whole, so a backup sees each message either with its outbox entry
	// or with everything its fan-out recorded elsewhere.
	quiet sync.RWMutex

	mu     sync.Mutex
	convs  map[uint64]*convQ
	ready  []uint64
	held   map[store.Pending]struct{} // queued or being fanned out
	queued int                        // items in convs
	wake   chan struct{}
	// cleared collects the entries cleared while a scan reads the store
	// (nil otherwise): its snapshot may still hold them.
	cleared map[store.Pending]struct{}

	lagAt, lagAll, lagHealthy atomic.Int64 // lag's last reading (unix ns) and values (ns)

	deferred atomic.Int64 // messages left to the scan because the queue was full
	done     atomic.Int64 // messages fanned out
	failed   atomic.Int64 // handler failures
}

// newOutbox returns an outbox that runs h; run starts it. A nil log
// discards.
func newOutbox(cfg Config, st outboxStore, h handler, log *slog.Logger) *outbox {
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &outbox{cfg: cfg, st: st, h: h, log: log, convs: make(map[uint64]*convQ),
		held: make(map[store.Pending]struct{}), wake: make(chan struct{}, 1)}
}

// enqueue hands a stored (acknowledged) message to the workers. It never
// blocks: with the queue full, the message waits in the store's outbox for
// the next scan.
func (o *outbox) enqueue(j Job) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.queued >= o.cfg.MaxQueued {
		o.deferred.Add(1)
		return
	}
	o.addLocked(item{seq: j.Msg.Seq, job: j})
}

// addLocked queues it unless its entry is held already.
func (o *outbox) addLocked(it item) {
	conv := it.job.Msg.ConvID
	key := store.Pending{ConvID: conv, Seq: it.seq}
	if _, ok := o.held[key]; ok {
		return
	}
	o.held[key] = struct{}{}
	if it.at.IsZero() {
		it.at = time.Now()
	}
	q := o.convs[conv]
	if q == nil {
		q = &convQ{}
		o.convs[conv] = q
	}
	i, _ := slices.BinarySearchFunc(q.items, it.seq, func(a item, s uint64) int { return cmpU(a.seq, s) })
	q.items = slices.Insert(q.items, i, it)
	o.queued++
	o.readyLocked(conv, q)
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (o *outbox) readyLocked(conv uint64, q *convQ) {
	if q.busy || q.ready || q.waiting || len(q.items) == 0 {
		return
	}
	q.ready = true
	o.ready = append(o.ready, conv)
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// wait returns once no message of conv with seq ≤ seq is queued or being
// fanned out in this process, or when ctx ends. Membership changes use it
// so that members who leave still get the pushes of what was sent before.
func (o *outbox) wait(ctx context.Context, conv, seq uint64) {
	for {
		o.mu.Lock()
		busy := false
		if q := o.convs[conv]; q != nil {
			busy = q.busy || (len(q.items) > 0 && q.items[0].seq <= seq)
		}
		o.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// backlog is the number of messages queued in memory or being fanned out.
func (o *outbox) backlog() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.held)
}

// lag is how long the oldest message queued or being fanned out here has
// waited since it was queued (0 with none): the fan-out's delay behind
// the ACKs. healthy is the same over the conversations whose last
// fan-out did not fail (those retrying with backoff wait for an engine,
// not for a worker). Read at most every lagEvery; between reads the last
// values are returned.
func (o *outbox) lag() (all, healthy time.Duration) {
	now := time.Now()
	if at := o.lagAt.Load(); at != 0 && now.UnixNano()-at < int64(lagEvery) {
		return time.Duration(o.lagAll.Load()), time.Duration(o.lagHealthy.Load())
	}
	o.mu.Lock()
	var oldest, oldestOK time.Time
	for _, q := range o.convs {
		var first time.Time
		if q.busy {
			first = q.since
		}
		if len(q.items) > 0 && (first.IsZero() || q.items[0].at.Before(first)) {
			first = q.items[0].at
		}
		if first.IsZero() {
			continue
		}
		if oldest.IsZero() || first.Before(oldest) {
			oldest = first
		}
		if q.fails == 0 && (oldestOK.IsZero() || first.Before(oldestOK)) {
			oldestOK = first
		}
	}
	o.mu.Unlock()
	age := func(t time.Time) time.Duration {
		if t.IsZero() {
			return 0
		}
		return max(now.Sub(t), 0)
	}
	all, healthy = age(oldest), age(oldestOK)
	o.lagAll.Store(int64(all))
	o.lagHealthy.Store(int64(healthy))
	o.lagAt.Store(now.UnixNano())
	return all, healthy
}

// lagEvery bounds how often lag walks the queues (it is read per send).
const lagEvery = 50 * time.Millisecond

// Stats are the outbox's counters.
type Stats struct {
	Done, Failed, Deferred int64
}

// stats returns the counters.
func (o *outbox) stats() Stats {
	return Stats{Done: o.done.Load(), Failed: o.failed.Load(), Deferred: o.deferred.Load()}
}

// run recovers the store's outbox, then fans out until ctx ends. What is
// queued then stays in the store's outbox for the next start. The workers
// start once the first scan has queued what a previous process left, so a
// message sent right after a restart is not fanned out before the older
// ones of its conversation (the webhooks' per-conversation order relies on
// it).
func (o *outbox) run(ctx context.Context) {
	seen := o.scan(ctx, nil)
	var wg sync.WaitGroup
	for range o.cfg.Workers {
		wg.Go(func() { o.work(ctx) })
	}
	wg.Go(func() { o.scanLoop(ctx, seen) })
	wg.Wait()
}

func (o *outbox) work(ctx context.Context) {
	for {
		conv, q, batch, ok := o.take(ctx)
		if !ok {
			return
		}
		o.turn(ctx, conv, q, batch)
	}
}

// take waits for a ready conversation and takes up to Batch of its items.
func (o *outbox) take(ctx context.Context) (uint64, *convQ, []item, bool) {
	for {
		o.mu.Lock()
		if ctx.Err() != nil {
			o.mu.Unlock()
			return 0, nil, nil, false
		}
		if len(o.ready) > 0 {
			conv := o.ready[0]
			o.ready = o.ready[1:]
			if len(o.ready) == 0 {
				o.ready = nil // let the array go
			}
			q := o.convs[conv]
			q.ready, q.busy = false, true
			n := min(len(q.items), o.cfg.Batch)
			q.since = q.items[0].at
			batch := slices.Clone(q.items[:n])
			q.items = q.items[n:]
			o.queued -= n
			if len(o.ready) > 0 {
				select { // pass the wake on
				case o.wake <- struct{}{}:
				default:
				}
			}
			o.mu.Unlock()
			return conv, q, batch, true
		}
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, nil, nil, false
		case <-o.wake:
		}
	}
}

// turn fans out batch in order, clears the entries done and puts back what
// is left after a failure.
func (o *outbox) turn(ctx context.Context, conv uint64, q *convQ, batch []item) {
	o.quiet.RLock()
	defer o.quiet.RUnlock()
	rest, err := o.fill(ctx, conv, batch)
	var done []uint64
	if err == nil {
		for i := range batch {
			if batch[i].read {
				// Not in the store: nothing to fan out (cannot happen
				// for a durable entry; cleared so it cannot stick).
				o.log.Warn("fan-out: outbox entry without its message; cleared", "conv", conv, "seq", batch[i].seq)
				done = append(done, batch[i].seq)
				continue
			}
			if err = o.h(ctx, batch[i].job); err != nil {
				rest = batch[i:]
				break
			}
			done = append(done, batch[i].seq)
		}
	} else {
		rest = batch
	}
	if len(done) > 0 {
		o.done.Add(int64(len(done)))
		// A failure here leaves the entries for a later scan, which
		// repeats their (idempotent) fan-out.
		if derr := o.st.FanoutDone(context.WithoutCancel(ctx), conv, done); derr != nil {
			o.log.Warn("fan-out: clearing outbox entries failed; they will be fanned out again", "conv", conv, "err", derr)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	q.busy = false
	for _, s := range done {
		p := store.Pending{ConvID: conv, Seq: s}
		delete(o.held, p)
		if o.cleared != nil {
			o.cleared[p] = struct{}{}
		}
	}
	if err != nil && ctx.Err() == nil {
		o.failed.Add(1)
		q.fails++
		back := min(o.cfg.MinBackoff<<min(q.fails-1, 16), o.cfg.MaxBackoff)
		o.log.Warn("fan-out failed; retrying", "conv", conv, "seq", rest[0].seq, "attempt", q.fails, "in", back, "err", err)
		q.items = append(slices.Clone(rest), q.items...)
		o.queued += len(rest)
		q.waiting = true
		time.AfterFunc(back, func() {
			o.mu.Lock()
			defer o.mu.Unlock()
			q.waiting = false
			if ctx.Err() == nil {
				o.readyLocked(conv, q)
			}
		})
		return
	}
	if err == nil {
		q.fails = 0
	}
	if len(q.items) == 0 && !q.waiting {
		delete(o.convs, conv)
		return
	}
	o.readyLocked(conv, q)
}

// fill reads the messages of items that have none, in one range read.
func (o *outbox) fill(ctx context.Context, conv uint64, batch []item) ([]item, error) {
	lo, hi := uint64(0), uint64(0)
	for _, it := range batch {
		if it.read {
			if lo == 0 {
				lo = it.seq
			}
			hi = it.seq
		}
	}
	if lo == 0 {
		return nil, nil
	}
	msgs, err := o.st.Messages(ctx, conv, lo, hi, int(hi-lo+1))
	if err != nil {
		return batch, err
	}
	by := make(map[uint64]store.Message, len(msgs))
	for _, m := range msgs {
		by[m.Seq] = m
	}
	for i := range batch {
		if !batch[i].read {
			continue
		}
		if m, ok := by[batch[i].seq]; ok {
			batch[i].job = Job{Msg: m}
			batch[i].read = false
		}
	}
	return nil, nil
}

// scanLoop reads the store's outbox every Scan interval (run has read it
// once at the start: what a previous process left), taking the entries no worker held in
// two scans running (a live entry is cleared in milliseconds; one that
// stays is left by a crashed process or by a full queue).
func (o *outbox) scanLoop(ctx context.Context, seen map[store.Pending]bool) {
	t := time.NewTicker(o.cfg.Scan)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			seen = o.scan(ctx, seen)
		}
	}
}

// scan queues the entries not held now that were in prev (all of them when
// prev is nil) and returns the entries it saw not held.
func (o *outbox) scan(ctx context.Context, prev map[store.Pending]bool) map[store.Pending]bool {
	o.mu.Lock()
	o.cleared = make(map[store.Pending]struct{})
	o.mu.Unlock()
	ps, err := o.st.Pending(ctx, o.cfg.ScanLimit)
	o.mu.Lock()
	defer o.mu.Unlock()
	cleared := o.cleared
	o.cleared = nil
	if err != nil {
		if ctx.Err() == nil {
			o.log.Warn("fan-out: reading the outbox failed; retrying at the next scan", "err", err)
		}
		return prev
	}
	seen := make(map[store.Pending]bool, len(ps))
	for _, p := range ps {
		if _, ok := o.held[p]; ok {
			continue
		}
		if _, ok := cleared[p]; ok {
			continue // done while the store was read
		}
		if prev != nil && !prev[p] {
			seen[p] = true
			continue
		}
		if o.queued >= o.cfg.MaxQueued {
			seen[p] = true // still waiting: next scan
			continue
		}
		o.addLocked(item{seq: p.Seq, job: Job{Msg: store.Message{ConvID: p.ConvID, Seq: p.Seq}}, read: true})
	}
	return seen
}
