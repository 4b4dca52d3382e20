// Package hooks produces and delivers Parley's webhooks (the receiving side
// is the public package webhook).
//
// The fan-out workers call Fanned once per message after its pushes were
// handed off (fanout.Hook): the message's events (message.created,
// recipient.offline, member.*) are written, for every endpoint that wants
// them, to a durable queue in one fsync, before the fan-out's outbox entry
// is cleared, so a crash in between produces them again (same idempotency
// ids). Nothing here runs on the request path: a send is acknowledged
// before its fan-out starts, and the fan-out only writes to the queue.
//
// The queue is a Pebble database of its own on an embedded node
// (queue.go) and, in cluster mode, JetStream streams every chat process
// shares, each partition's events delivered by the partition's owner
// (jsqueue.go).
//
// Delivery runs per endpoint: one conversation's events go out one at a
// time in (seq, type) order, up to Concurrency conversations at once. A
// failed attempt (a transport error, a timeout, any status but 2xx) is
// retried after an exponential backoff while that conversation's later
// events wait; other conversations go on. After MaxAttempts the event
// becomes a dead letter (kept in the queue's database, counted in
// parley_webhook_dead_total) and the conversation moves on.
package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/webhook"
)

// Members reads a conversation's current members (recipient.offline of
// medium and large groups, whose fan-out lists only members online).
type Members interface {
	Members(ctx context.Context, convID uint64) ([]store.Member, error)
}

// Options of New.
type Options struct {
	Dir     string // the queue's database
	FS      vfs.FS // nil: disk
	Members Members
	Logger  *slog.Logger
	// Client overrides the HTTP client (tests); nil builds one per
	// endpoint with its timeout.
	Client *http.Client
	// Settle is how long an event waits in the queue before it is due
	// (default DefaultSettle).
	Settle time.Duration
	// Cluster, when set, replaces the Pebble queue (Dir, FS) with the
	// JetStream queue every chat process shares (jsqueue.go).
	Cluster *Cluster
}

// DefaultSettle: the fan-out of two messages of one conversation sent at
// the same moment by different senders may run in either order (each is
// handed to the outbox after its own append); holding every event this
// long before it is due lets the queue, which sorts by seq, put them back
// in order.
const DefaultSettle = 200 * time.Millisecond

// Hooks produces and delivers webhooks. Its methods are safe for
// concurrent use.
type Hooks struct {
	cfg     Config
	settle  time.Duration
	q       *queue   // embedded mode
	jq      *jsQueue // cluster mode
	members Members
	log     *slog.Logger
	eps     []*endpoint
	names   []string
	// wantOffline: some endpoint takes recipient.offline (fan-out then
	// collects the users it reached).
	wantOffline bool
	// wants[t] lists the endpoints that take event type t (index in
	// webhook.Types).
	wants [][]int
}

type endpoint struct {
	Endpoint
	idx    int
	secret []byte
	client *http.Client
	wake   chan struct{}
	// sem bounds the conversations delivered at once in cluster mode;
	// listeners (the partitions' delivery loops) hear when a slot frees.
	sem       chan struct{}
	listenMu  sync.Mutex
	listeners map[int]func()
	listenID  int

	mu    sync.Mutex
	convs map[uint64]*convState
	next  uint64 // conversation the next scan starts at

	backlog   atomic.Int64
	delivered atomic.Int64
	failed    atomic.Int64
	deadN     atomic.Int64
}

type convState struct {
	busy  bool
	until time.Time // no attempt before
}

var _ fanout.Hook = (*Hooks)(nil)

// New opens the queue and prepares the endpoints; Run delivers.
func New(cfg Config, o Options) (*Hooks, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	cfg = cfg.WithDefaults()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	h := &Hooks{cfg: cfg, settle: o.Settle, members: o.Members, log: o.Logger, wants: make([][]int, len(webhook.Types))}
	for i, e := range cfg.Endpoints {
		sec, err := e.secret()
		if err != nil {
			return nil, err
		}
		c := o.Client
		if c == nil {
			c = &http.Client{
				Timeout:   e.Timeout,
				Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: e.Concurrency, IdleConnTimeout: 90 * time.Second},
				// A redirect is an answer that is not 2xx: retried, never followed.
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			}
		}
		ep := &endpoint{Endpoint: e, idx: i, secret: sec, client: c, wake: make(chan struct{}, 1), convs: map[uint64]*convState{},
			sem: make(chan struct{}, e.Concurrency), listeners: map[int]func(){}}
		h.eps = append(h.eps, ep)
		h.names = append(h.names, e.Name)
		for _, t := range e.Events {
			ti := slices.Index(webhook.Types, t)
			h.wants[ti] = append(h.wants[ti], i)
			if t == webhook.RecipientOffline {
				h.wantOffline = true
			}
		}
	}
	if o.Cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		jq, err := newJSQueue(ctx, h, *o.Cluster)
		if err != nil {
			return nil, err
		}
		h.jq = jq
		return h, nil
	}
	q, err := openQueue(o.Dir, o.FS, o.Logger)
	if err != nil {
		return nil, err
	}
	h.q = q
	for _, ep := range h.eps {
		n, err := q.count('q', ep.Name)
		if err != nil {
			q.close()
			return nil, fmt.Errorf("webhooks: %w", err)
		}
		ep.backlog.Store(int64(n))
		d, err := q.count('d', ep.Name)
		if err != nil {
			q.close()
			return nil, fmt.Errorf("webhooks: %w", err)
		}
		ep.deadN.Store(int64(d))
	}
	return h, nil
}

// Close closes the queue (after Run has returned).
func (h *Hooks) Close() error {
	if h.q == nil {
		return nil
	}
	return h.q.close()
}

// WantsReached reports whether fan-out must tell which users it reached.
func (h *Hooks) WantsReached() bool { return h.wantOffline }

// typeOf maps a membership event (protocol.SystemEvent.Event) to its
// webhook type; "" for events without one (device events of E2E
// conversations).
func typeOf(event string) string {
	switch event {
	case "member_added":
		return webhook.MemberAdded
	case "member_removed":
		return webhook.MemberRemoved
	case "member_left":
		return webhook.MemberLeft
	case "role_changed":
		return webhook.MemberRoleChanged
	case "muted":
		return webhook.MemberMuted
	case "unmuted":
		return webhook.MemberUnmuted
	}
	return ""
}

func convKind(k store.ConvKind) string {
	if k == store.Direct {
		return protocol.ConvDirect
	}
	return protocol.ConvGroup
}

// Fanned queues the events of a fanned-out message for every endpoint that
// wants them (fanout.Hook). An error means nothing durable was written; the
// fan-out is then retried.
func (h *Hooks) Fanned(ctx context.Context, f fanout.Fanned) error {
	m := f.Msg
	var items []item
	add := func(typ string, data any, perEndpoint func(ep *endpoint) any) error {
		ti := slices.Index(webhook.Types, typ)
		if len(h.wants[ti]) == 0 {
			return nil
		}
		var shared []byte
		for _, i := range h.wants[ti] {
			d := data
			if perEndpoint != nil {
				d = perEndpoint(h.eps[i])
			} else if shared != nil {
				items = append(items, item{ep: i, key: qkey{conv: m.ConvID, seq: m.Seq, typ: uint8(ti)}, body: shared})
				continue
			}
			raw, err := json.Marshal(d)
			if err != nil {
				return err
			}
			body, err := json.Marshal(webhook.Event{ID: webhook.ID(m.ConvID, m.Seq, typ), Type: typ, Time: m.ServerTime, ConvID: m.ConvID, Seq: m.Seq, Data: raw})
			if err != nil {
				return err
			}
			if perEndpoint == nil {
				shared = body
			}
			items = append(items, item{ep: i, key: qkey{conv: m.ConvID, seq: m.Seq, typ: uint8(ti)}, body: body})
		}
		return nil
	}
	var err error
	switch m.Kind {
	case protocol.KindSystem:
		var ev protocol.SystemEvent
		if json.Unmarshal([]byte(m.Body), &ev) == nil {
			switch typ := typeOf(ev.Event); {
			case typ != "":
				err = add(typ, webhook.MemberData{Actor: ev.Actor, Users: nonNil(ev.Users), Role: ev.Role, Admin: ev.Admin}, nil)
			case ev.Event == "notice":
				// A notice of the server API is a message for the
				// members (never in E2E conversations).
				err = add(webhook.MessageCreated, webhook.MessageData{ConvKind: convKind(f.Conv.Kind), Message: wire(m)}, nil)
			}
		}
	default:
		wm := wire(m)
		if f.Conv.E2E {
			wm.Body = "" // never a body of an E2E conversation, even ciphertext
		}
		err = add(webhook.MessageCreated, webhook.MessageData{ConvKind: convKind(f.Conv.Kind), E2E: f.Conv.E2E, Message: wm}, nil)
		if err == nil && m.Kind == protocol.KindText && h.wantOffline {
			var offline []string
			if offline, err = h.offline(ctx, f); err == nil && len(offline) > 0 {
				d := webhook.OfflineData{ConvKind: convKind(f.Conv.Kind), E2E: f.Conv.E2E, MsgID: m.MsgID, Sender: m.Sender, Users: offline}
				err = add(webhook.RecipientOffline, nil, func(ep *endpoint) any {
					d := d
					switch {
					case f.Conv.E2E || ep.Preview == PreviewNone:
					case ep.Preview == PreviewSender:
						d.Preview = &webhook.Preview{Sender: m.Sender}
					case ep.Preview == PreviewFull:
						d.Preview = &webhook.Preview{Sender: m.Sender, Body: m.Body}
					}
					return d
				})
			}
		}
	}
	if err != nil {
		return fmt.Errorf("webhooks: %w", err)
	}
	if len(items) == 0 {
		return nil
	}
	if h.jq != nil {
		if err := h.jq.put(ctx, items); err != nil {
			return fmt.Errorf("webhooks: queue: %w", err)
		}
		return nil
	}
	fresh, err := h.q.put(h.names, items, time.Now())
	if err != nil {
		return fmt.Errorf("webhooks: queue: %w", err)
	}
	for _, it := range fresh {
		h.eps[it.ep].backlog.Add(1)
		h.eps[it.ep].wakeUp()
	}
	return nil
}

// offline lists the members who may see f.Msg (the sender excluded) with
// no device reached by its push.
func (h *Hooks) offline(ctx context.Context, f fanout.Fanned) ([]string, error) {
	reached := make(map[string]struct{}, len(f.Reached))
	for _, u := range f.Reached {
		reached[u] = struct{}{}
	}
	var out []string
	consider := func(u string) {
		if u == f.Msg.Sender {
			return
		}
		if _, ok := reached[u]; !ok {
			out = append(out, u)
		}
	}
	if f.AllRecipients {
		for _, u := range f.Recipients {
			consider(u)
		}
	} else {
		if h.members == nil {
			return nil, errors.New("no member reader for a medium or large group")
		}
		ms, err := h.members.Members(ctx, f.Msg.ConvID)
		if err != nil {
			return nil, fmt.Errorf("members: %w", err)
		}
		for _, mb := range ms {
			if mb.JoinSeq <= f.Msg.Seq {
				consider(mb.UserID)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func wire(m store.Message) protocol.Message {
	return protocol.Message{
		ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, Sender: m.Sender, SenderDevice: m.SenderDevice,
		ClientMsgID: m.ClientMsgID, Kind: m.Kind, Body: m.Body, TargetSeq: m.TargetSeq, ServerTime: m.ServerTime,
		Edited: m.Edited, Recalled: m.Recalled, Mentions: m.Mentions, MentionAll: m.MentionAll, CoalesceKey: m.CoalesceKey,
	}
}

func (ep *endpoint) wakeUp() {
	select {
	case ep.wake <- struct{}{}:
	default:
	}
}

// Stats of one endpoint.
type Stats struct {
	Endpoint                string
	Backlog                 int64 // events queued
	Delivered, Failed, Dead int64 // since start (Dead: in the queue's database)
}

// Stats returns the endpoints' counters. In cluster mode Backlog and Dead
// count the shared streams (every process reports the same figures),
// Delivered and Failed this process's attempts.
func (h *Hooks) Stats() []Stats {
	out := make([]Stats, len(h.eps))
	var js *jsCounts
	if h.jq != nil {
		js = h.jq.counts()
	}
	for i, ep := range h.eps {
		out[i] = Stats{Endpoint: ep.Name, Backlog: ep.backlog.Load(), Delivered: ep.delivered.Load(), Failed: ep.failed.Load(), Dead: ep.deadN.Load()}
		if js != nil {
			out[i].Backlog, out[i].Dead = js.backlog[ep.Name], js.dead[ep.Name]
		}
	}
	return out
}

func (ep *endpoint) acquire() bool {
	select {
	case ep.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

// release frees a slot and tells the delivery loops.
func (ep *endpoint) release() {
	<-ep.sem
	ep.listenMu.Lock()
	fs := make([]func(), 0, len(ep.listeners))
	for _, f := range ep.listeners {
		fs = append(fs, f)
	}
	ep.listenMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// listen calls f whenever a slot frees, until the returned func is called.
func (ep *endpoint) listen(f func()) func() {
	ep.listenMu.Lock()
	defer ep.listenMu.Unlock()
	ep.listenID++
	id := ep.listenID
	ep.listeners[id] = f
	return func() {
		ep.listenMu.Lock()
		defer ep.listenMu.Unlock()
		delete(ep.listeners, id)
	}
}

// scanLimit bounds the conversations one scan hands out.
const scanLimit = 1024

// Run delivers until ctx ends.
func (h *Hooks) Run(ctx context.Context) {
	if h.jq != nil {
		h.jq.run(ctx)
		return
	}
	var wg sync.WaitGroup
	for _, ep := range h.eps {
		wg.Go(func() { h.runEndpoint(ctx, ep) })
	}
	wg.Wait()
}

func (h *Hooks) runEndpoint(ctx context.Context, ep *endpoint) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, ep.Concurrency)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := time.Now()
		wait := time.Second
		ep.mu.Lock()
		free := ep.Concurrency - busy(ep.convs)
		from := ep.next
		ep.mu.Unlock()
		if free > 0 {
			heads, err := h.q.heads(ep.Name, from, min(free, scanLimit), func(conv uint64) bool {
				ep.mu.Lock()
				defer ep.mu.Unlock()
				st := ep.convs[conv]
				if st == nil {
					return false
				}
				if !st.busy && st.until.After(now) {
					wait = min(wait, st.until.Sub(now))
				}
				return st.busy || st.until.After(now)
			})
			if err != nil {
				h.log.Error("webhooks: reading the queue failed", "endpoint", ep.Name, "err", err)
			}
			for _, hd := range heads {
				ep.mu.Lock()
				st := ep.convs[hd.key.conv]
				if st == nil {
					st = &convState{}
					ep.convs[hd.key.conv] = st
				}
				st.busy = true
				ep.next = hd.key.conv + 1
				ep.mu.Unlock()
				// The scan read a snapshot: the head may have been
				// delivered, or retried, while it ran.
				fresh, ok, err := h.q.get(ep.Name, hd.key)
				if err != nil || !ok {
					if err != nil {
						h.log.Error("webhooks: reading the queue failed", "endpoint", ep.Name, "err", err)
					}
					ep.mu.Lock()
					delete(ep.convs, hd.key.conv)
					ep.mu.Unlock()
					ep.wakeUp()
					continue
				}
				hd = fresh
				if due := hd.queued.Add(h.settle); due.After(now) {
					ep.mu.Lock()
					st.busy, st.until = false, due
					ep.mu.Unlock()
					time.AfterFunc(due.Sub(now), ep.wakeUp)
					continue
				}
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					h.deliver(ctx, ep, hd)
				})
			}
		} else {
			wait = time.Second
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-ep.wake:
		case <-timer.C:
		}
	}
}

func busy(m map[uint64]*convState) int {
	n := 0
	for _, st := range m {
		if st.busy {
			n++
		}
	}
	return n
}

// deliver makes one attempt at hd and records its outcome.
func (h *Hooks) deliver(ctx context.Context, ep *endpoint, hd head) {
	hd.attempts++
	err := h.post(ctx, ep, hd)
	if ctx.Err() != nil && err != nil {
		ep.mu.Lock()
		delete(ep.convs, hd.key.conv)
		ep.mu.Unlock()
		return // stopping: the event stays queued, its attempt not counted
	}
	var until time.Time
	switch {
	case err == nil:
		if qerr := h.q.done(ep.Name, hd.key); qerr != nil {
			h.log.Error("webhooks: clearing a delivered event failed; it will be sent again", "endpoint", ep.Name, "err", qerr)
		}
		ep.backlog.Add(-1)
		ep.delivered.Add(1)
	case hd.attempts >= h.cfg.MaxAttempts:
		ep.failed.Add(1)
		h.log.Error("webhook failed for the last time; moved to the dead letters", "endpoint", ep.Name,
			"conv", hd.key.conv, "seq", hd.key.seq, "type", webhook.Types[hd.key.typ], "attempts", hd.attempts, "err", err)
		if qerr := h.q.bury(ep.Name, hd, err.Error()); qerr != nil {
			h.log.Error("webhooks: dead-lettering failed; retrying", "endpoint", ep.Name, "err", qerr)
			until = time.Now().Add(h.cfg.MaxBackoff)
			break
		}
		ep.backlog.Add(-1)
		ep.deadN.Add(1)
	default:
		ep.failed.Add(1)
		back := min(h.cfg.MinBackoff<<min(hd.attempts-1, 30), h.cfg.MaxBackoff)
		until = time.Now().Add(back)
		h.log.Warn("webhook attempt failed; retrying", "endpoint", ep.Name, "conv", hd.key.conv, "seq", hd.key.seq,
			"type", webhook.Types[hd.key.typ], "attempt", hd.attempts, "in", back, "err", err)
		if qerr := h.q.failed(ep.Name, hd); qerr != nil {
			h.log.Error("webhooks: recording an attempt failed", "endpoint", ep.Name, "err", qerr)
		}
	}
	ep.mu.Lock()
	if until.IsZero() {
		delete(ep.convs, hd.key.conv)
	} else {
		ep.convs[hd.key.conv] = &convState{until: until}
		// Wake when the backoff ends.
		time.AfterFunc(time.Until(until), ep.wakeUp)
	}
	ep.mu.Unlock()
	ep.wakeUp()
}

// post sends one attempt; nil means the receiver answered 2xx.
func (h *Hooks) post(ctx context.Context, ep *endpoint, hd head) error {
	rctx, cancel := context.WithTimeout(ctx, ep.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, ep.URL, bytes.NewReader(hd.body))
	if err != nil {
		return err
	}
	now := time.Now()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "parley-webhooks/1")
	req.Header.Set(webhook.HeaderID, webhook.ID(hd.key.conv, hd.key.seq, webhook.Types[hd.key.typ]))
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(ep.secret, now, hd.body))
	req.Header.Set(webhook.HeaderAttempt, strconv.Itoa(hd.attempts))
	resp, err := ep.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// Dead returns the dead letters of an endpoint (tests, operators).
func (h *Hooks) Dead(endpoint string) ([]json.RawMessage, error) {
	var (
		recs []deadRecord
		err  error
	)
	if h.jq != nil {
		recs, err = h.jq.deadLetters(endpoint)
	} else {
		recs, err = h.q.dead(endpoint)
	}
	if err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, len(recs))
	for i, r := range recs {
		out[i] = r.Event
	}
	return out, nil
}
