// Package fanout makes a stored message visible after the sender's ACK. It
// is the one home of what happens to a message once the store holds it:
//
//   - who receives it (recipients.go): both members of a direct
//     conversation; every member of a small group whose join_seq is at or
//     below the message; in medium and large groups only the members
//     online, from the online index (Index: Online on an embedded node,
//     Scoped over a Roster in cluster mode), so the cost follows the
//     members online, not the group's size;
//   - the group's tier (tier.go): decided from its size with hysteresis,
//     recorded in the store, and the online index kept in step — medium and
//     large groups are tracked (Track, Untrack), and membership changes
//     reach it through Joined and Left;
//   - pushes (push.go): a frame is encoded once and handed to every gateway
//     node that holds a device of a recipient, one bus delivery per node. A
//     message's push that a node cannot take right now becomes a
//     compensation task for that node; the chat service's best-effort
//     frames (receipts, typing, notices) go through Push the same way,
//     with no compensation;
//   - conversation rows (rows.go): write fan-out by tier and mention rows in
//     every tier; a failed write becomes a compensation task;
//   - compensation (compensate.go): Compensate is the ledger's task handler,
//     redoing the rows and pushes recorded;
//   - the consumers of a stored message (consumer.go): every Consumer in
//     Deps receives each fanned-out message with its recipients (Fanned)
//     before its outbox entry is cleared. The webhooks are one; a new
//     consumer (search indexing, push notifications) is a package of its
//     own, wired in internal/server.
//
// # The path of a stored message
//
// The chat service appends a message with its outbox entry (the entry is
// durable with the message, store.Store.Append), acknowledges it and hands
// it to Enqueue. A worker then runs FanOut: the conversation (as the
// request read it, or read again), its tier, the recipients, the pushes,
// the rows, the consumers; and only then clears the entry
// (store.Store.FanoutDone). Pushes go before rows: no read path takes
// last_seq from a row, so recipients need not wait for the rows' write.
// Work that fails is recorded in the ledger and the message still counts
// as fanned out; an error that could neither be done nor recorded — the
// registry unreadable, the ledger down, a consumer's error — keeps the
// entry, and the conversation is retried with backoff.
//
// Per conversation, messages are fanned out one at a time in seq order (as
// they reach the outbox); conversations run in parallel on a bounded set of
// workers. The in-memory queue is bounded: beyond it, messages wait in the
// store's outbox, which a periodic scan reads back, as it reads the entries
// left by a crashed process (at start, and those no worker takes for a scan
// interval).
//
// # Concurrency
//
// A Fanout's methods are safe for concurrent use. Run owns every goroutine
// of the fan-out (the workers and the scan) and returns once they have
// stopped. Push, Tier, Joined and Left run on their caller's goroutine
// (the chat service's requests); a message push to several nodes hands off
// to them concurrently and waits for every hand-off. Consumers see the
// messages of a conversation in seq order, on the worker that fans them
// out, and at least once: a retry or a crash before the entry was cleared
// repeats a message, so Fanned must tolerate repeats, and must only record
// (it delays the conversation's next message).
//
// The package knows nothing of requests: the chat service calls it
// (Enqueue, Wait, Push, Tier, Joined, Left); it never calls back.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/store"
)

// Store is what the fan-out needs of the store.
type Store interface {
	outboxStore
	Conversation(ctx context.Context, id uint64) (store.Conversation, error)
	Members(ctx context.Context, convID uint64) ([]store.Member, error)
	SetTier(ctx context.Context, convID uint64, tier uint8) error
	UpdateRows(ctx context.Context, convID, seq uint64, users []string, mention bool) error
}

// Registry finds the gateway nodes of users' devices (registry.Registry).
type Registry interface {
	Lookup(ctx context.Context, users []string) (map[string][]registry.Entry, error)
}

// Bus hands a push to a gateway node (bus.Bus).
type Bus interface {
	Publish(ctx context.Context, node string, d bus.Delivery) error
}

// Ledger records fan-out work that failed, for retry (ledger.Ledger, whose
// Run takes Compensate).
type Ledger interface {
	Record(ctx context.Context, t ledger.Task) error
}

// Observer receives the fan-out's measurements; nil fields are skipped.
type Observer struct {
	Pushed     func(n int) // users handed to a gateway node
	PushFailed func()      // a registry lookup or a node's hand-off failed
	// Fanout reports one stored message's fan-out: its tier, the
	// conversation rows written and the users pushed to.
	Fanout      func(tier string, rows, pushes int)
	Compensated func(kind string)
}

// Deps are what a Fanout runs on.
type Deps struct {
	Store    Store
	Registry Registry
	Bus      Bus
	Ledger   Ledger
	Online   Index
	Tiers    Tiers
	Observer Observer
	Logger   *slog.Logger // nil: discard
	// Consumers receive every fanned-out message, in this order.
	Consumers []Consumer
}

// Fanout is the fan-out of one chat process.
type Fanout struct {
	// compQuiet is held shared by each Compensate and whole by Quiesce.
	compQuiet sync.RWMutex
	st        Store
	reg       Registry
	bus       Bus
	ledger    Ledger
	online    Index
	tiers     Tiers
	obs       Observer
	log       *slog.Logger
	consumers []Consumer
	out       *outbox
	// reactEvery is Config.ReactionInterval; reacts are the held
	// reaction runs by conversation (reactions.go), guarded by reactMu
	// (taken before a run's own lock, never while waiting for it).
	reactEvery time.Duration
	reactMu    sync.Mutex
	reacts     map[uint64]*reactRun
}

// New returns a fan-out; Run starts its workers. Zero fields of cfg take
// their defaults.
func New(cfg Config, d Deps) (*Fanout, error) {
	if d.Store == nil || d.Registry == nil || d.Bus == nil || d.Ledger == nil || d.Online == nil {
		return nil, errors.New("fanout: store, registry, bus, ledger and online index are required")
	}
	if d.Tiers.SmallBelow <= 0 || d.Tiers.LargeAbove < d.Tiers.SmallBelow {
		return nil, fmt.Errorf("fanout: tiers %+v: need 0 < small_below <= large_above", d.Tiers)
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fanout{st: d.Store, reg: d.Registry, bus: d.Bus, ledger: d.Ledger, online: d.Online, tiers: d.Tiers,
		obs: d.Observer, log: d.Logger, consumers: d.Consumers}
	f.out = newOutbox(cfg, d.Store, f.FanOut, d.Logger)
	f.reactEvery, f.reacts = f.out.cfg.ReactionInterval, map[uint64]*reactRun{}
	return f, nil
}

// Run recovers the store's outbox, then fans out until ctx ends, and
// returns once its goroutines have stopped. What is queued then stays in
// the store's outbox for the next start. The workers start once the first
// scan has queued what a previous process left, so a message sent right
// after a restart is not fanned out before the older ones of its
// conversation (consumers rely on the per-conversation order).
func (f *Fanout) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { f.reactLoop(ctx) })
	f.out.run(ctx)
	wg.Wait()
}

// Enqueue hands a stored (acknowledged) message to the workers. It never
// blocks: with the queue full, the message waits in the store's outbox for
// the next scan.
func (f *Fanout) Enqueue(j Job) { f.out.enqueue(j) }

// Wait returns once no message of conv with seq ≤ seq is queued or being
// fanned out in this process, or when ctx ends. Membership changes use it
// so that members who leave still get the pushes of what was sent before.
func (f *Fanout) Wait(ctx context.Context, conv, seq uint64) { f.out.wait(ctx, conv, seq) }

// Backlog is the number of messages queued in memory or being fanned out.
func (f *Fanout) Backlog() int { return f.out.backlog() }

// Lag is how long the oldest message queued or being fanned out in this
// process has waited since its ACK (0 when none waits): how far delivery
// is behind the acknowledgements. It is at most 50 ms old.
func (f *Fanout) Lag() time.Duration {
	all, _ := f.out.lag()
	return all
}

// LoadLag is Lag over the conversations whose fan-out is not retrying
// after a failure: the delay that more workers or chat processes would
// cut, not the one an unreachable engine (the registry, the bus) causes.
func (f *Fanout) LoadLag() time.Duration {
	_, healthy := f.out.lag()
	return healthy
}

// Stats returns the outbox's counters.
func (f *Fanout) Stats() Stats { return f.out.stats() }

// FanOut makes one stored message visible: the workers' handler, exported
// for callers that fan out in their own goroutine (tests). Failures of row
// writes and pushes become compensation tasks; an error is returned only
// when something could neither be done nor recorded, or a consumer failed,
// and the message's fan-out is then to be retried whole.
func (f *Fanout) FanOut(ctx context.Context, j Job) error {
	cv, err := f.conversation(ctx, j)
	if err != nil {
		return err
	}
	tier := f.Tier(ctx, cv)
	if IsReaction(j.Msg.Kind) && coalesces(cv, tier) {
		f.holdReaction(j, cv, tier)
		return f.consume(ctx, Fanned{Msg: j.Msg, Conv: cv})
	}
	// What is held goes first: the pushes cover the seqs in order.
	f.flushReactions(ctx, cv.ID)
	if IsReaction(j.Msg.Kind) {
		j.Msg = f.withCounts(ctx, j)
	}
	recipients, err := f.recipients(ctx, cv, tier, j)
	if err != nil {
		return fmt.Errorf("recipients: %w", err)
	}
	rc := f.collectReached(j.Msg)
	var pushed int
	if lists, ok := f.groupLists(cv, tier); ok {
		pushed, err = f.pushGroup(ctx, lists, j.Msg, tier, rc)
	} else {
		pushed, err = f.pushMessage(ctx, recipients, j.Msg, tier, rc)
	}
	if err != nil {
		return err
	}
	if len(j.Leavers) > 0 && cv.Kind == store.Group {
		f.online.Left(cv.ID, j.Leavers)
	}
	rows, err := f.rows(ctx, j, cv, tier, recipients)
	if err != nil {
		return err
	}
	fanned := Fanned{Msg: j.Msg, Conv: cv, Recipients: recipients, AllRecipients: tier == TierSmall}
	if rc != nil {
		fanned.Reached = rc.users
	}
	if err := f.consume(ctx, fanned); err != nil {
		return err
	}
	if f.obs.Fanout != nil {
		f.obs.Fanout(TierName(tier), rows, pushed)
	}
	return nil
}

// conversation is the conversation of j's message, as the request read it
// when it did.
func (f *Fanout) conversation(ctx context.Context, j Job) (store.Conversation, error) {
	if j.Conv != nil && j.Conv.ID == j.Msg.ConvID {
		return *j.Conv, nil
	}
	cv, err := f.st.Conversation(ctx, j.Msg.ConvID)
	if err != nil {
		return cv, fmt.Errorf("conversation: %w", err)
	}
	return cv, nil
}
