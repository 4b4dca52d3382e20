// Package hooks produces and delivers Parley's webhooks (the receiving side
// is the public package webhook).
//
// The fan-out workers call Fanned once per message after its pushes were
// handed off (a fanout.Consumer): the message's events (message.created,
// recipient.offline, member.*) are written, for every endpoint that wants
// them, to a durable queue in one fsync, before the fan-out's outbox entry
// is cleared, so a crash in between produces them again (same idempotency
// ids). Nothing here runs on the request path: a send is acknowledged
// before its fan-out starts, and the fan-out only writes to the queue.
//
// The queue is the seam Queue (queue.go), declared here and implemented
// by one package per engine: internal/hooks/pebble, a database of its own
// on an embedded node, and internal/hooks/jetstream, streams every chat
// process shares in cluster mode, each partition's events delivered by the
// partition's owner. Both pass the conformance suite internal/hooks/
// hookstest, which also runs the delivery tests below on each.
//
// One delivery loop (Dispatcher, dispatch.go, which the pusher of
// internal/push shares; the webhook attempt is in deliver.go) runs per
// Lane the queue hands out (per endpoint on Pebble; per endpoint and held
// partition on JetStream): one
// conversation's events go out one at a time in (seq, type) order, up to
// the endpoint's Concurrency conversations at once across its lanes. A
// failed attempt (a transport error, a timeout, any status but 2xx) is
// retried after an exponential backoff while that conversation's later
// events wait; other conversations go on. After MaxAttempts the event
// becomes a dead letter (kept by the queue, counted in
// parley_webhook_dead) and the conversation moves on.
package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

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
	// Queue keeps the events (required). Once New succeeds the Hooks
	// own it and close it in Close.
	Queue   Queue
	Members Members
	Logger  *slog.Logger
	// Client overrides the HTTP client (tests); nil builds one per
	// endpoint with its timeout.
	Client *http.Client
	// Settle is how long an event waits in the queue before it is due
	// (default DefaultSettle).
	Settle time.Duration
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
	q       Queue
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
	secret []byte
	client *http.Client
	// slots bound the conversations delivered at once across the
	// endpoint's lanes.
	slots *Slots

	delivered atomic.Int64
	failed    atomic.Int64
}

var _ fanout.Consumer = (*Hooks)(nil)

// New prepares the endpoints on o.Queue; Run delivers.
func New(cfg Config, o Options) (*Hooks, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	if o.Queue == nil {
		return nil, errors.New("webhooks: no queue")
	}
	cfg = cfg.WithDefaults()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	h := &Hooks{cfg: cfg, settle: o.Settle, q: o.Queue, members: o.Members, log: o.Logger, wants: make([][]int, len(webhook.Types))}
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
		ep := &endpoint{Endpoint: e, secret: sec, client: c, slots: NewSlots(e.Concurrency)}
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
	return h, nil
}

// Close closes the queue (after Run has returned).
func (h *Hooks) Close() error { return h.q.Close() }

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
// wants them (fanout.Consumer). An error means nothing durable was written; the
// fan-out is then retried.
func (h *Hooks) Fanned(ctx context.Context, f fanout.Fanned) error {
	m := f.Msg
	var evs []Event
	add := func(typ string, data any, perEndpoint func(ep *endpoint) any) error {
		ti := slices.Index(webhook.Types, typ)
		if len(h.wants[ti]) == 0 {
			return nil
		}
		var shared []byte
		key := Key{Conv: m.ConvID, Seq: m.Seq, Type: uint8(ti)}
		for _, i := range h.wants[ti] {
			d := data
			if perEndpoint != nil {
				d = perEndpoint(h.eps[i])
			} else if shared != nil {
				evs = append(evs, Event{Endpoint: h.names[i], Key: key, Body: shared})
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
			evs = append(evs, Event{Endpoint: h.names[i], Key: key, Body: body})
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
		d := webhook.MessageData{ConvKind: convKind(f.Conv.Kind), E2E: f.Conv.E2E, Message: wm}
		fb, isFile := fileBody(m, f.Conv.E2E)
		if isFile {
			d.Attachment = &webhook.Attachment{AttachmentID: m.Attachment, Name: fb.Name, Size: fb.Size,
				MediaType: fb.MediaType, SHA256: fb.SHA256, Width: fb.Width, Height: fb.Height, DurationMS: fb.DurationMS}
		}
		err = add(webhook.MessageCreated, d, nil)
		if err == nil && (m.Kind == protocol.KindText || m.Kind == protocol.KindFile) && h.wantOffline {
			var offline []string
			if offline, err = Offline(ctx, h.members, f); err == nil && len(offline) > 0 {
				d := webhook.OfflineData{ConvKind: convKind(f.Conv.Kind), E2E: f.Conv.E2E, MsgID: m.MsgID, Sender: m.Sender, Users: offline}
				err = add(webhook.RecipientOffline, nil, func(ep *endpoint) any {
					d := d
					switch {
					case f.Conv.E2E || ep.Preview == PreviewNone:
					case ep.Preview == PreviewSender:
						d.Preview = &webhook.Preview{Sender: m.Sender}
					case ep.Preview == PreviewFull && m.Kind == protocol.KindFile:
						d.Preview = &webhook.Preview{Sender: m.Sender, Body: fb.Caption, File: fb.Name}
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
	if len(evs) == 0 {
		return nil
	}
	if err := h.q.Put(ctx, evs); err != nil {
		return fmt.Errorf("webhooks: queue: %w", err)
	}
	return nil
}

// Offline lists the members who may see f.Msg (the sender excluded) with
// no device reached by its push: recipient.offline's users, and the
// pusher's (internal/push). members reads a medium or large group's.
func Offline(ctx context.Context, members Members, f fanout.Fanned) ([]string, error) {
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
		if members == nil {
			return nil, errors.New("no member reader for a medium or large group")
		}
		ms, err := members.Members(ctx, f.Msg.ConvID)
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

// fileBody is the body of a plain conversation's file message: the
// FileBody the server composed from the upload when it stored the message
// (a recalled one has none). An E2E conversation's body is ciphertext,
// and its file's key never reaches the server.
func fileBody(m store.Message, e2e bool) (protocol.FileBody, bool) {
	var fb protocol.FileBody
	if e2e || m.Kind != protocol.KindFile || m.Attachment == 0 || m.Body == "" {
		return fb, false
	}
	if json.Unmarshal([]byte(m.Body), &fb) != nil {
		return fb, false
	}
	return fb, true
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
		AttachmentID: m.Attachment,
	}
}

// Stats of one endpoint.
type Stats struct {
	Endpoint          string
	Backlog           int64 // events queued
	Delivered, Failed int64 // this process's attempts since start
	Dead              int64 // dead letters the queue keeps
}

// Stats returns the endpoints' counters. In cluster mode Backlog and Dead
// count the shared streams (every process reports the same figures),
// Delivered and Failed this process's attempts.
func (h *Hooks) Stats() []Stats {
	out := make([]Stats, len(h.eps))
	for i, ep := range h.eps {
		backlog, dead := h.q.Stats(ep.Name)
		out[i] = Stats{Endpoint: ep.Name, Backlog: backlog, Delivered: ep.delivered.Load(), Failed: ep.failed.Load(), Dead: dead}
	}
	return out
}

// Dead returns the dead letters of an endpoint (tests, operators).
func (h *Hooks) Dead(ctx context.Context, endpoint string) ([]json.RawMessage, error) {
	recs, err := h.q.Dead(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, len(recs))
	for i, r := range recs {
		out[i] = r.Event
	}
	return out, nil
}
