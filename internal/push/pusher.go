// Package push sends notifications to phones and browsers (APNs, FCM, Web
// Push) for messages whose recipients have no device connected.
//
// The pusher is a fan-out consumer (fanout.Consumer) on the webhooks'
// durable queue (hooks.Queue, a queue instance of its own: Pebble at
// data_dir/push on an embedded node, JetStream streams in cluster mode
// with each partition delivered by its owner). Fanned writes one event
// per text or file message with offline recipients (hooks.Offline), in
// the fan-out, before the message's outbox entry is cleared; the delivery
// loops (the webhooks' hooks.Dispatcher) hand each conversation's events
// out in seq order, and an attempt here removes one only once every
// registration of its users was answered, so a crash
// loses none (an event in flight is sent again: the collapse id makes the
// device show it once).
//
// A conversation's events within Config.Burst make one notification: an
// event with a later one of its conversation behind it is superseded
// (removed unsent) unless the conversation has had no notification for
// CollapseMax, and so is one produced late, after a later message of its
// conversation was notified (LateWindow); the one sent carries the user's
// unread count of the conversation and the badge (unread of every
// conversation). An E2E
// conversation's notification never carries content: a background
// (content-available / data-only) push the app wakes on to fetch and
// decrypt.
//
// Who of the offline users is notified, and how often, is policy.go's: no
// notification for a member who muted the conversation (a mention by
// name still notifies) or a user in do-not-disturb, and at most
// Config.DeviceRate per device per DeviceInterval, the excess held in
// memory and coalesced into the device's next notification.
package push

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Endpoint is the pusher's endpoint name in its queue.
const Endpoint = "push"

// Store is what the pusher reads and writes.
type Store interface {
	hooks.Members
	PushRegs(ctx context.Context, user string) ([]store.PushReg, error)
	PushDrop(ctx context.Context, provider, token string, before int64) error
	UserConversations(ctx context.Context, user string) ([]store.ConvRow, error)
	Read(ctx context.Context, user, device string, convID uint64) (uint64, error)
	ConvMute(ctx context.Context, user string, convID uint64) (int64, error)
	DND(ctx context.Context, user string) (store.DND, error)
}

// Options of New.
type Options struct {
	Queue  hooks.Queue // required; the pusher owns it once New succeeds
	Store  Store
	Logger *slog.Logger
	// Client overrides the providers' HTTP client (tests).
	Client *http.Client
	Now    func() time.Time
}

// event is a queued event's body.
type event struct {
	Conv   uint64   `json:"conv,string"`
	Seq    uint64   `json:"seq"`
	MsgID  uint64   `json:"msg_id,string"`
	Sender string   `json:"sender"`
	Group  bool     `json:"group,omitempty"`
	E2E    bool     `json:"e2e,omitempty"`
	Users  []string `json:"users"`
	// Mentioned are the users of Users the message mentions by name (a
	// mention is notified in a conversation they muted).
	Mentioned []string `json:"mentioned,omitempty"`
	Text      string   `json:"text,omitempty"` // preview full (plain conversations only)
	At        int64    `json:"at"`             // the message's server time, unix ms
}

// Stats of one provider.
type Stats struct {
	Provider              string
	Sent, Failed, Removed int64
}

type counters struct{ sent, failed, removed atomic.Int64 }

// Pusher produces and sends notifications.
type Pusher struct {
	cfg   Config
	q     hooks.Queue
	st    Store
	log   *slog.Logger
	now   func() time.Time
	provs map[string]provider
	stats map[string]*counters
	slots *hooks.Slots

	collapsed atomic.Int64
	quieted   suppressed
	limit     *limiter // the per-device rate limit (policy.go)
	// Lag observes the delay from a message's server time to its
	// provider request (nil: none).
	Lag func(time.Duration)

	mu sync.Mutex
	// since: conversation → when it began collapsing (an event
	// superseded, none sent since).
	since map[uint64]time.Time
	// sent: conversation → the last seq notified and when, for
	// LateWindow: an event of an earlier seq queued after it (its
	// fan-out ran late) is superseded by it.
	sent    map[uint64]sentSeq
	pruneAt int // len(sent) at which entries past LateWindow go
}

type sentSeq struct {
	seq uint64
	at  time.Time
}

// LateWindow is how long the pusher remembers a conversation's last
// notification, so that an earlier message's event produced after it
// (the outbox's fan-out after a crash, a fan-out retried) is dropped
// rather than taking the device back to an older message.
const LateWindow = time.Minute

var _ fanout.Consumer = (*Pusher)(nil)

// New prepares the configured providers.
func New(cfg Config, o Options) (*Pusher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Queue == nil || o.Store == nil {
		return nil, errors.New("push: a queue and a store are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := o.Client
	if c == nil {
		c = &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true,
			MaxIdleConnsPerHost: cfg.Concurrency, IdleConnTimeout: 90 * time.Second}}
	}
	p := &Pusher{cfg: cfg, q: o.Queue, st: o.Store, log: o.Logger, now: o.Now, provs: map[string]provider{},
		stats: map[string]*counters{}, slots: hooks.NewSlots(cfg.Concurrency), since: map[uint64]time.Time{},
		sent: map[uint64]sentSeq{}, pruneAt: minPrune,
		limit: newLimiter(cfg.DeviceRate, cfg.DeviceInterval)}
	if cfg.APNs.KeyFile != "" {
		a, err := newAPNs(cfg.APNs, c, o.Now)
		if err != nil {
			return nil, err
		}
		p.provs[protocol.PushAPNs] = a
	}
	if cfg.FCM.CredentialsFile != "" {
		f, err := newFCM(cfg.FCM, c, o.Now)
		if err != nil {
			return nil, err
		}
		p.provs[protocol.PushFCM] = f
	}
	if cfg.WebPush.VAPIDKeyFile != "" {
		w, err := newWebPush(cfg.WebPush, c, o.Now)
		if err != nil {
			return nil, err
		}
		p.provs[protocol.PushWebPush] = w
	}
	for _, name := range []string{protocol.PushAPNs, protocol.PushFCM, protocol.PushWebPush} {
		p.stats[name] = &counters{}
	}
	return p, nil
}

// WantsReached: the pusher needs the users fan-out reached.
func (p *Pusher) WantsReached() bool { return true }

// Fanned queues a text or file message's event for its offline members.
func (p *Pusher) Fanned(ctx context.Context, f fanout.Fanned) error {
	m := f.Msg
	if m.Kind != protocol.KindText && m.Kind != protocol.KindFile {
		return nil
	}
	users, err := hooks.Offline(ctx, p.st, f)
	if err != nil {
		return fmt.Errorf("push: %w", err)
	}
	if len(users) == 0 {
		return nil
	}
	ev := event{Conv: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, Group: f.Conv.Kind == store.Group, E2E: f.Conv.E2E, Users: users, At: m.ServerTime}
	for _, u := range m.Mentions {
		if slices.Contains(users, u) {
			ev.Mentioned = append(ev.Mentioned, u)
		}
	}
	if !f.Conv.E2E && p.cfg.Preview != PreviewNone {
		ev.Sender = m.Sender
		if p.cfg.Preview == PreviewFull {
			ev.Text = previewText(m)
		}
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if err := p.q.Put(ctx, []hooks.Event{{Endpoint: Endpoint, Key: hooks.Key{Conv: m.ConvID, Seq: m.Seq}, Body: body}}); err != nil {
		return fmt.Errorf("push: queue: %w", err)
	}
	return nil
}

// previewMax bounds a notification's text (providers take 4 KiB in all).
const previewMax = 1024

func previewText(m store.Message) string {
	t := m.Body
	if m.Kind == protocol.KindFile {
		var fb protocol.FileBody
		if json.Unmarshal([]byte(m.Body), &fb) != nil {
			return ""
		}
		t = fb.Caption
		if t == "" {
			t = fb.Name
		}
	}
	if len(t) > previewMax {
		cut := previewMax
		for cut > 0 && t[cut]&0xC0 == 0x80 {
			cut--
		}
		t = t[:cut] + "…"
	}
	return t
}

const minPrune = 1024

// late reports whether a later message of ev's conversation was notified
// within LateWindow.
func (p *Pusher) late(ev event) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.sent[ev.Conv]
	return ok && ev.Seq < s.seq && time.Since(s.at) < LateWindow
}

// notified records ev's conversation notified up to ev's seq, and forgets
// the conversations notified longer than LateWindow ago once the map has
// doubled since it last did.
func (p *Pusher) notified(ev event) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.since, ev.Conv)
	if s := p.sent[ev.Conv]; s.seq > ev.Seq {
		ev.Seq = s.seq
	}
	p.sent[ev.Conv] = sentSeq{seq: ev.Seq, at: now}
	if len(p.sent) < p.pruneAt {
		return
	}
	for c, s := range p.sent {
		if now.Sub(s.at) >= LateWindow {
			delete(p.sent, c)
		}
	}
	p.pruneAt = max(minPrune, 2*len(p.sent))
}

// Close closes the queue (after Run has returned).
func (p *Pusher) Close() error { return p.q.Close() }

// Stats returns each provider's counters since start.
func (p *Pusher) Stats() []Stats {
	var out []Stats
	for _, name := range []string{protocol.PushAPNs, protocol.PushFCM, protocol.PushWebPush} {
		c := p.stats[name]
		out = append(out, Stats{Provider: name, Sent: c.sent.Load(), Failed: c.failed.Load(), Removed: c.removed.Load()})
	}
	return out
}

// Collapsed counts events superseded by a later one of their conversation.
func (p *Pusher) Collapsed() int64 { return p.collapsed.Load() }

// Backlog is the queue's events and dead letters.
func (p *Pusher) Backlog() (backlog, dead int64) { return p.q.Stats(Endpoint) }
