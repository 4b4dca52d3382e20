package route

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Subjects of the chat tier, under the deployment's namespace (several
// deployments, or tests, can share one NATS). Chat processes subscribe in
// one queue group, so each request goes to exactly one of them.
func subjectHandle(ns string) string   { return ns + ".chat.handle" }
func subjectMayWatch(ns string) string { return ns + ".chat.maywatch" }

// subjectPart carries the writes of partition p's conversations to the
// partition's owner (see lease.Owner), which alone subscribes to it.
func subjectPart(ns string, p int) string { return ns + ".chat.p." + strconv.Itoa(p) }

// ownerWrites are the frames that append to their conversation, and the
// delivered and read acks of its messages: the gateway sends them to the
// conversation's owner. The owner knows the conversation's last seq in
// memory, so an ack there costs no read of the seq index (any other
// process probes it), and one process holds the conversation's delivered
// positions and the read positions its sends remember (chat.ownRead).
var ownerWrites = map[string]bool{
	protocol.TypeSend: true, protocol.TypeEdit: true, protocol.TypeRecall: true, protocol.TypeReact: true,
	protocol.TypeAddMembers: true, protocol.TypeRemove: true, protocol.TypeLeave: true,
	protocol.TypeSetRole: true, protocol.TypeMute: true, protocol.TypeDelivered: true,
	protocol.TypeRead: true,
}

// ownerKey returns the key whose partition's owner runs f for user, if f
// goes to an owner: a conversation's write goes to the owner of the
// conversation, an open_direct to the owner of the pair's key
// (store.DirectKey), which alone decides the pair's conversation in
// cluster mode (store/cassandra direct.go).
func ownerKey(user string, f *protocol.Frame) (uint64, bool) {
	switch {
	case f.Type == protocol.TypeOpenDirect:
		return store.DirectKey(user, f.Peer, f.E2E), true
	case ownerWrites[f.Type] && f.ConvID != 0:
		return f.ConvID, true
	case f.Type == protocol.TypeDelivered && len(f.Positions) > 0:
		return f.Positions[0].ConvID, true // one partition's (Remote.positions)
	}
	return 0, false
}

// DefaultMaxInflight is ServeConfig's default bound on requests in progress.
const DefaultMaxInflight = 1024

// ownerWait bounds how long a gateway waits for a partition to get an
// owner (a takeover in progress) before it answers overloaded.
const ownerWait = 3 * time.Second

const chatQueue = "chat"

// request is a gateway's call to the chat tier.
type request struct {
	User   string          `json:"u"`
	Device string          `json:"d"`
	Frame  json.RawMessage `json:"f,omitempty"`
	// Frames is a batch: one connection's sends to one conversation, in
	// the order sent, answered with a JSON array of their answers in that
	// order (Remote.HandleBatch).
	Frames []json.RawMessage `json:"fs,omitempty"`
	Peer   string            `json:"p,omitempty"` // maywatch
}

// Remote is the chat tier as seen from a gateway: gateway.Backend over NATS.
type Remote struct {
	nc         *natsio.Conn
	ns         string
	timeout    time.Duration
	partitions int
}

// NewRemote returns a backend that sends requests over nc to the chat tier
// of namespace ns, each bounded by timeout (and by the caller's context).
// Writes to a conversation go to the owner of its partition (of
// partitions, as the chat processes count them), the rest to any chat
// process.
func NewRemote(nc *natsio.Conn, ns string, timeout time.Duration, partitions int) *Remote {
	if partitions <= 0 {
		partitions = lease.DefaultPartitions
	}
	return &Remote{nc: nc, ns: ns, timeout: timeout, partitions: partitions}
}

// Handle forwards f to one chat process and relays its single answer. A
// delivered of several positions goes to their partitions' owners, one
// request per partition, and is answered once: the first error, or ok.
func (r *Remote) Handle(ctx context.Context, c chat.Caller, f *protocol.Frame, reply func(*protocol.Frame)) {
	if f.Type == protocol.TypeDelivered && len(f.Positions) > 0 {
		r.positions(ctx, c, f, reply)
		return
	}
	r.forward(ctx, c, f, reply)
}

// HandleBatch implements gateway.Batcher: sends to one conversation, in
// the order sent, go to its owner as one request; the owner runs them at
// once, each queuing for the conversation's write in that order, and
// answers them together.
func (r *Remote) HandleBatch(ctx context.Context, c chat.Caller, fs []*protocol.Frame, reply func(int, *protocol.Frame)) {
	if len(fs) == 1 {
		r.forward(ctx, c, fs[0], func(f *protocol.Frame) { reply(0, f) })
		return
	}
	fail := func(e *protocol.Error) {
		for i, f := range fs {
			reply(i, chat.ErrorFrame(f.RID, e))
		}
	}
	raws := make([]json.RawMessage, len(fs))
	for i, f := range fs {
		raw, err := json.Marshal(f)
		if err != nil {
			fail(protocol.Errorf(protocol.CodeInternal, "encode request"))
			return
		}
		raws[i] = raw
	}
	data, _ := json.Marshal(request{User: c.User, Device: c.Device, Frames: raws})
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	key, _ := ownerKey(c.User, fs[0])
	msg, err := toOwner(ctx, r.nc, subjectPart(r.ns, lease.Partition(key, r.partitions)), data)
	if err != nil {
		fail(remoteErr(err))
		return
	}
	var answers []*protocol.Frame
	if err := json.Unmarshal(msg.Data, &answers); err != nil || len(answers) != len(fs) {
		// One error for the whole batch (moved, or refused).
		var one protocol.Frame
		if json.Unmarshal(msg.Data, &one) == nil && one.Type == protocol.TypeError {
			fail(&protocol.Error{Code: one.Code, Msg: one.Error, RetryAfter: one.RetryAfter})
			return
		}
		fail(protocol.Errorf(protocol.CodeInternal, "undecodable answer from the chat tier"))
		return
	}
	for i, a := range answers {
		if a != nil {
			reply(i, a)
		}
	}
}

// forward sends f to its chat process and relays the answer.
func (r *Remote) forward(ctx context.Context, c chat.Caller, f *protocol.Frame, reply func(*protocol.Frame)) {
	raw, err := json.Marshal(f)
	if err != nil {
		reply(chat.ErrorFrame(f.RID, protocol.Errorf(protocol.CodeInternal, "encode request")))
		return
	}
	data, _ := json.Marshal(request{User: c.User, Device: c.Device, Frame: raw})
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var msg *natsio.Msg
	if key, ok := ownerKey(c.User, f); ok {
		msg, err = toOwner(ctx, r.nc, subjectPart(r.ns, lease.Partition(key, r.partitions)), data)
	} else {
		msg, err = r.nc.RequestWithContext(ctx, subjectHandle(r.ns), data)
	}
	if err != nil {
		reply(chat.ErrorFrame(f.RID, remoteErr(err)))
		return
	}
	if len(msg.Data) == 0 || string(msg.Data) == "null" {
		return // the request needed no answer
	}
	var resp protocol.Frame
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		reply(chat.ErrorFrame(f.RID, protocol.Errorf(protocol.CodeInternal, "undecodable answer from the chat tier")))
		return
	}
	reply(&resp)
}

// positions sends a delivered frame's positions to their owners, grouped
// by partition, and answers f once.
func (r *Remote) positions(ctx context.Context, c chat.Caller, f *protocol.Frame, reply func(*protocol.Frame)) {
	byPart := make(map[int][]protocol.Position, 1)
	var order []int
	for _, p := range f.Positions {
		part := lease.Partition(p.ConvID, r.partitions)
		if _, ok := byPart[part]; !ok {
			order = append(order, part)
		}
		byPart[part] = append(byPart[part], p)
	}
	if len(order) == 1 {
		r.forward(ctx, c, f, reply)
		return
	}
	var first *protocol.Frame
	for _, part := range order {
		sub := &protocol.Frame{Type: protocol.TypeDelivered, RID: f.RID, Positions: byPart[part]}
		r.forward(ctx, c, sub, func(resp *protocol.Frame) {
			if resp.Type == protocol.TypeError && first == nil {
				first = resp
			}
		})
	}
	switch {
	case first != nil:
		reply(first)
	case f.RID != "":
		reply(&protocol.Frame{Type: protocol.TypeOK, RID: f.RID})
	}
}

// headerMoved marks the answer of a chat process that refused a write
// because the conversation's partition just moved away from it.
const headerMoved = "Parley-Moved"

// toOwner sends a request to a partition's owner (on subject, which only
// the owner subscribes to), waiting (up to ownerWait) while the partition
// has none or is moving.
func toOwner(ctx context.Context, nc *natsio.Conn, subject string, data []byte) (*natsio.Msg, error) {
	deadline := time.Now().Add(ownerWait)
	for {
		msg, err := nc.RequestWithContext(ctx, subject, data)
		retry := errors.Is(err, natsio.ErrNoResponders) || err == nil && msg.Header.Get(headerMoved) != ""
		if !retry || time.Now().After(deadline) {
			return msg, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MayWatch asks the chat tier whether a may see b's presence.
func (r *Remote) MayWatch(ctx context.Context, a, b string) (bool, error) {
	data, _ := json.Marshal(request{User: a, Peer: b})
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	msg, err := r.nc.RequestWithContext(ctx, subjectMayWatch(r.ns), data)
	if err != nil {
		return false, fmt.Errorf("route: maywatch: %w", err)
	}
	switch string(msg.Data) {
	case "1":
		return true, nil
	case "0":
		return false, nil
	}
	return false, fmt.Errorf("route: maywatch: %s", msg.Data)
}

// remoteErr maps a failed request to the client-facing error. A timeout
// leaves the outcome unknown: the client retries, and sends are idempotent.
func remoteErr(err error) *protocol.Error {
	switch {
	case errors.Is(err, natsio.ErrNoResponders):
		return &protocol.Error{Code: protocol.CodeOverloaded, Msg: "no chat service is available", RetryAfter: 1000}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, natsio.ErrTimeout):
		return protocol.Errorf(protocol.CodeTimeout, "the chat service did not answer in time; retry")
	}
	return &protocol.Error{Code: protocol.CodeOverloaded, Msg: "the chat service is unreachable", RetryAfter: 1000}
}

// DefaultTimeout is ServeConfig's default bound on one request.
const DefaultTimeout = 10 * time.Second

// ServeConfig configures Serve. Conn, Namespace and Service are
// required; zero Timeout, MaxInflight and Logger take their defaults.
type ServeConfig struct {
	Conn *natsio.Conn
	// Namespace prefixes the subjects served (the deployment's namespace,
	// as the gateways' Remote uses it).
	Namespace string
	Service   *chat.Service
	// Owner, if set, makes the process also answer the writes of the
	// partitions it holds; nil: it answers only what any chat process may.
	Owner *lease.Owner
	// Timeout bounds each request (default DefaultTimeout).
	Timeout time.Duration
	// MaxInflight bounds the requests served at once (default
	// DefaultMaxInflight); past it a request is answered overloaded.
	MaxInflight int
	Logger      *slog.Logger
}

// Validate reports every setting Serve cannot run with.
func (c ServeConfig) Validate() error {
	var errs []error
	if c.Conn == nil {
		errs = append(errs, errors.New("route: serve: Conn is required"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("route: serve: Namespace is required"))
	}
	if c.Service == nil {
		errs = append(errs, errors.New("route: serve: Service is required"))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("route: serve: Timeout must not be negative, got %v", c.Timeout))
	}
	if c.MaxInflight < 0 {
		errs = append(errs, fmt.Errorf("route: serve: MaxInflight must not be negative, got %d", c.MaxInflight))
	}
	return errors.Join(errs...)
}

func (c ServeConfig) withDefaults() ServeConfig {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Serve answers gateways' requests with cfg.Service until ctx ends.
// Requests run on at most cfg.MaxInflight goroutines at once, each bounded
// by cfg.Timeout; past that a request is answered at once with overloaded
// and a jittered retry_after_ms (admission control: nothing queues without
// bound). When ctx ends, Serve unsubscribes and waits for the requests in
// progress, which keep their own timeout.
//
// With cfg.Owner, the process also answers the writes of the partitions it
// holds (subjectPart), subscribing and unsubscribing as it takes and
// gives them up. The partitions' subscriptions are in one queue group, so
// while a partition moves a write reaches one of the two processes: the
// new owner serves it, the old one answers it "moved" (MovingMsg, with
// the Parley-Moved header) and the gateway sends it again.
func Serve(ctx context.Context, cfg ServeConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	nc, ns, svc, owner, log, timeout := cfg.Conn, cfg.Namespace, cfg.Service, cfg.Owner, cfg.Logger, cfg.Timeout
	var (
		sem = make(chan struct{}, cfg.MaxInflight)
		wg  sync.WaitGroup
	)
	// admit runs fn on a goroutine of its own unless maxInflight are
	// running; it reports whether it did.
	admit := func(fn func(ctx context.Context)) bool {
		select {
		case sem <- struct{}{}:
		default:
			return false
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			defer cancel()
			fn(rctx)
		}()
		return true
	}
	serve := func(m *natsio.Msg, req request, f *protocol.Frame) {
		var answered bool
		reply := func(resp *protocol.Frame) {
			if answered {
				return
			}
			answered = true
			data, _ := json.Marshal(resp)
			respond(m, data, resp.Type == protocol.TypeError && resp.Code == protocol.CodeOverloaded && resp.Error == chat.MovingMsg)
		}
		ok := admit(func(rctx context.Context) {
			svc.Handle(rctx, chat.Caller{User: req.User, Device: req.Device}, f, reply)
			if !answered {
				_ = m.Respond(nil)
			}
		})
		if !ok {
			reply(chat.ErrorFrame(f.RID, &protocol.Error{Code: protocol.CodeOverloaded,
				Msg: "the chat process is at capacity; retry", RetryAfter: 100 + rand.Int64N(400)}))
		}
	}
	// serveBatch runs a batch's sends at once, each in its turn
	// (store.Turn: they queue for the conversation's write in the order
	// sent), and answers them together once all are answered.
	serveBatch := func(m *natsio.Msg, req request, fs []*protocol.Frame) {
		c := chat.Caller{User: req.User, Device: req.Device}
		answers := make([]*protocol.Frame, len(fs))
		var mu sync.Mutex
		var pending sync.WaitGroup
		var prev *store.Turn
		for i, f := range fs {
			t := store.NewTurn(prev)
			pending.Add(1)
			ok := admit(func(rctx context.Context) {
				defer pending.Done()
				defer t.Take()
				svc.Handle(store.WithTurn(rctx, t), c, f, func(resp *protocol.Frame) {
					mu.Lock()
					if answers[i] == nil {
						answers[i] = resp
					}
					mu.Unlock()
				})
			})
			if !ok {
				pending.Done()
				answers[i] = chat.ErrorFrame(f.RID, &protocol.Error{Code: protocol.CodeOverloaded,
					Msg: "the chat process is at capacity; retry", RetryAfter: 100 + rand.Int64N(400)})
				continue // the next one's turn follows the last admitted
			}
			prev = t
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pending.Wait()
			moved := true // every one refused as moved: the gateway sends the batch again
			for _, a := range answers {
				moved = moved && a != nil && a.Type == protocol.TypeError && a.Code == protocol.CodeOverloaded && a.Error == chat.MovingMsg
			}
			data, _ := json.Marshal(answers)
			respond(m, data, moved)
		}()
	}
	// decode reads a request; the gateway validated the frame
	// (protocol.DecodeClient) before forwarding it.
	decode := func(m *natsio.Msg) (request, *protocol.Frame, bool) {
		var req request
		var f protocol.Frame
		if err := json.Unmarshal(m.Data, &req); err != nil {
			log.Warn("undecodable chat request", "err", err)
			return req, nil, false
		}
		if len(req.Frames) > 0 {
			// A batch: its first frame routes it (decodeBatch reads all).
			req.Frame = req.Frames[0]
		}
		if err := json.Unmarshal(req.Frame, &f); err != nil {
			data, _ := json.Marshal(chat.ErrorFrame("", protocol.Errorf(protocol.CodeBadFrame, "undecodable frame")))
			_ = m.Respond(data)
			return req, nil, false
		}
		return req, &f, true
	}
	// dispatch serves a decoded request, a batch or one frame.
	dispatch := func(m *natsio.Msg, req request, f *protocol.Frame) {
		if len(req.Frames) == 0 {
			serve(m, req, f)
			return
		}
		fs, perr := decodeBatch(req.Frames)
		if perr != nil {
			data, _ := json.Marshal(chat.ErrorFrame(f.RID, perr))
			_ = m.Respond(data)
			return
		}
		serveBatch(m, req, fs)
	}
	handle := func(m *natsio.Msg) {
		if req, f, ok := decode(m); ok {
			dispatch(m, req, f)
		}
	}
	sub1, err := nc.QueueSubscribe(subjectHandle(ns), chatQueue, handle)
	if err != nil {
		return fmt.Errorf("route: subscribe: %w", err)
	}
	defer sub1.Unsubscribe()
	sub2, err := nc.QueueSubscribe(subjectMayWatch(ns), chatQueue, func(m *natsio.Msg) {
		var req request
		if json.Unmarshal(m.Data, &req) != nil {
			return
		}
		ok := admit(func(rctx context.Context) {
			ok, err := svc.SharesConversation(rctx, req.User, req.Peer)
			switch {
			case err != nil:
				_ = m.Respond([]byte("error: " + err.Error()))
			case ok:
				_ = m.Respond([]byte("1"))
			default:
				_ = m.Respond([]byte("0"))
			}
		})
		if !ok {
			_ = m.Respond([]byte("error: the chat process is at capacity"))
		}
	})
	if err != nil {
		return fmt.Errorf("route: subscribe: %w", err)
	}
	defer sub2.Unsubscribe()
	var ps *partSubs
	if owner != nil {
		ps = &partSubs{nc: nc, ns: ns, owner: owner, log: log, subs: map[int][2]*natsio.Subscription{}}
		ps.handle = func(m *natsio.Msg) {
			req, f, ok := decode(m)
			if !ok {
				return
			}
			key, ok := ownerKey(req.User, f)
			if !ok {
				key = f.ConvID
			}
			if !owner.Holds(lease.Partition(key, owner.Partitions())) {
				// Given up since the request was routed here: say so,
				// and the gateway sends it again to the new owner (an
				// unanswered request would wait out its timeout).
				data, _ := json.Marshal(chat.ErrorFrame(f.RID, movingErr()))
				respond(m, data, true)
				return
			}
			dispatch(m, req, f)
		}
		lim := svc.Limits()
		ps.handleAdmin = func(m *natsio.Msg) {
			req, f, conv, perr := decodeAdmin(m.Data, lim)
			if perr != nil {
				log.Warn("refused admin request", "err", perr)
				respondAdmin(m, adminAnswer{Err: toWire(perr)})
				return
			}
			if !owner.Holds(lease.Partition(conv, owner.Partitions())) {
				respondAdmin(m, adminAnswer{Err: toWire(movingErr())})
				return
			}
			ok := admit(func(rctx context.Context) { respondAdmin(m, runAdmin(rctx, svc, req, f)) })
			if !ok {
				respondAdmin(m, adminAnswer{Err: toWire(&protocol.Error{Code: protocol.CodeOverloaded,
					Msg: "the chat process is at capacity; retry", RetryAfter: 100 + rand.Int64N(400)})})
			}
		}
		owner.Watch(ps.update)
		defer ps.close()
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("route: subscribe: %w", err)
	}
	<-ctx.Done()
	// Drain: no new requests, then the ones in progress finish.
	_ = sub1.Unsubscribe()
	_ = sub2.Unsubscribe()
	if ps != nil {
		// ps.close runs deferred too; closing twice is harmless.
		ps.close()
	}
	wg.Wait()
	return nil
}

// decodeBatch reads a batch's frames: sends to one conversation (the
// gateway validated each with protocol.DecodeClient before forwarding it).
func decodeBatch(raws []json.RawMessage) ([]*protocol.Frame, *protocol.Error) {
	fs := make([]*protocol.Frame, len(raws))
	for i, raw := range raws {
		fs[i] = new(protocol.Frame)
		if err := json.Unmarshal(raw, fs[i]); err != nil {
			return nil, protocol.Errorf(protocol.CodeBadFrame, "undecodable frame in a batch")
		}
		if fs[i].Type != protocol.TypeSend || fs[i].ConvID == 0 || fs[i].ConvID != fs[0].ConvID {
			return nil, protocol.Errorf(protocol.CodeBadFrame, "a batch holds sends to one conversation")
		}
	}
	return fs, nil
}

// partSubs keeps, for each partition the owner holds, a subscription to
// subjectPart (clients' writes) and one to subjectAdminPart (the server
// API's).
type partSubs struct {
	nc          *natsio.Conn
	ns          string
	owner       *lease.Owner
	log         *slog.Logger
	handle      natsio.MsgHandler
	handleAdmin natsio.MsgHandler
	mu          sync.Mutex
	subs        map[int][2]*natsio.Subscription
	closed      bool
}

// update makes the subscriptions of p follow whether the owner holds it.
func (ps *partSubs) update(p int, _ bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	want := ps.owner.Holds(p) && !ps.closed
	subs, have := ps.subs[p]
	switch {
	case want && !have:
		s1, err := ps.nc.QueueSubscribe(subjectPart(ps.ns, p), ownerQueue, ps.handle)
		if err != nil {
			ps.log.Error("ownership: subscribe failed", "partition", p, "err", err)
			return
		}
		s2, err := ps.nc.QueueSubscribe(subjectAdminPart(ps.ns, p), ownerQueue, ps.handleAdmin)
		if err != nil {
			_ = s1.Unsubscribe()
			ps.log.Error("ownership: subscribe failed", "partition", p, "err", err)
			return
		}
		ps.subs[p] = [2]*natsio.Subscription{s1, s2}
	case !want && have:
		// Drain, not Unsubscribe: the requests already on their way
		// are still handled, and answered "moved".
		_ = subs[0].Drain()
		_ = subs[1].Drain()
		delete(ps.subs, p)
	}
}

// ownerQueue is the queue group of the partitions' subscriptions: a
// request goes to one subscriber, never to both the old and the new owner.
const ownerQueue = "owner"

// movingErr answers a write that reached a process no longer owning its
// partition; the caller retries it on the new owner (toOwner).
func movingErr() *protocol.Error {
	return &protocol.Error{Code: protocol.CodeOverloaded, Msg: chat.MovingMsg, RetryAfter: 200}
}

func (ps *partSubs) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.closed = true
	for p, s := range ps.subs {
		_ = s[0].Drain()
		_ = s[1].Drain()
		delete(ps.subs, p)
	}
}

// Routed is the backend of a process that runs both roles in cluster
// mode: writes to a conversation whose partition another process owns go
// to that owner over NATS, everything else to the local chat service.
type Routed struct {
	Local  *chat.Service
	Remote *Remote
	Owner  *lease.Owner
}

// Handle implements gateway.Backend.
func (r Routed) Handle(ctx context.Context, c chat.Caller, f *protocol.Frame, reply func(*protocol.Frame)) {
	if key, ok := ownerKey(c.User, f); ok && !r.Owner.Holds(lease.Partition(key, r.Owner.Partitions())) {
		r.Remote.Handle(ctx, c, f, reply)
		return
	}
	r.Local.Handle(ctx, c, f, reply)
}

// HandleBatch implements gateway.Batcher: a batch to a conversation another
// process owns goes there as one request; the local service runs a batch
// of its own conversation's sends one after another.
func (r Routed) HandleBatch(ctx context.Context, c chat.Caller, fs []*protocol.Frame, reply func(int, *protocol.Frame)) {
	if key, ok := ownerKey(c.User, fs[0]); ok && !r.Owner.Holds(lease.Partition(key, r.Owner.Partitions())) {
		r.Remote.HandleBatch(ctx, c, fs, reply)
		return
	}
	for i, f := range fs {
		r.Local.Handle(ctx, c, f, func(resp *protocol.Frame) { reply(i, resp) })
	}
}

// respond answers m with data; moved marks the answer "the conversation
// just moved away from this process", which the caller retries on the new
// owner.
func respond(m *natsio.Msg, data []byte, moved bool) {
	if !moved {
		_ = m.Respond(data)
		return
	}
	r := natsio.NewMsg(m.Reply)
	r.Data = data
	r.Header.Set(headerMoved, "1")
	_ = m.RespondMsg(r)
}
