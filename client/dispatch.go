package client

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/parley-im/parley/protocol"
)

const (
	// deliveredDelay coalesces delivered acknowledgements of direct
	// conversations and small groups (pushes without an ack policy): the
	// sender's delivered receipt waits at most this long for them.
	deliveredDelay = 100 * time.Millisecond
	// batchDelay is how long acknowledgements of medium groups' pushes
	// (ack "batch") may wait: one delivered frame with positions then
	// covers every conversation handed over meanwhile.
	batchDelay = time.Second
	// dispatchRetry spaces retries of the dispatcher's own requests
	// (history, conv_list, sync) after a retryable error without a hint.
	dispatchRetry = time.Second
)

// dispatcher owns the ordered delivery of one connection: the (re)connect
// sync, per-conversation ordering and gap fetches, events to the
// application and delivered acknowledgements. It runs on one goroutine; the
// answers to its own requests come back as closures through post, so it
// never waits for the network and the reader never waits for it.
type dispatcher struct {
	c   *Client
	cn  *conn
	log *slog.Logger

	conv   map[uint64]*convOrder
	dirty  map[uint64]uint64 // positions handed over, not yet saved and acknowledged
	flushT *time.Timer
	flushC <-chan time.Time // nil while no flush is armed
	// flushAt is when the armed flush fires: a position due sooner (a
	// direct conversation's behind a medium group's) brings it forward.
	flushAt time.Time

	syncLeft int                      // initial sync answers still expected
	listing  bool                     // a conv_list is in flight
	catchUp  bool                     // the next conv_list answer also re-fetches every conversation
	dead     bool                     // an event could not be handed over: the connection ended
	timers   map[*time.Timer]struct{} // pending retries, stopped by finish

	wake chan struct{}
	// mu guards mail, the closures posted by request callbacks and Sync.
	mu   sync.Mutex
	mail []func()
}

func newDispatcher(c *Client, cn *conn) *dispatcher {
	return &dispatcher{
		c:      c,
		cn:     cn,
		log:    c.log,
		conv:   make(map[uint64]*convOrder),
		dirty:  make(map[uint64]uint64),
		timers: make(map[*time.Timer]struct{}),
		wake:   make(chan struct{}, 1),
	}
}

// post runs fn on the dispatcher goroutine. Safe from any goroutine; never
// blocks.
func (d *dispatcher) post(fn func()) {
	d.mu.Lock()
	d.mail = append(d.mail, fn)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *dispatcher) runMail() {
	d.mu.Lock()
	mail := d.mail
	d.mail = nil
	d.mu.Unlock()
	for _, fn := range mail {
		if d.dead {
			return
		}
		fn()
	}
}

// request sends f; handle runs on the dispatcher goroutine with the outcome.
func (d *dispatcher) request(f protocol.Frame, handle func(*protocol.Frame, error)) {
	_, err := d.cn.request(context.Background(), f, func(r *protocol.Frame, err error) {
		d.post(func() { handle(r, err) })
	})
	if err != nil && err != errConnGone {
		d.log.Error("client: request", "type", f.Type, "err", err)
	}
}

// later runs fn on the dispatcher goroutine after delay.
func (d *dispatcher) later(delay time.Duration, fn func()) {
	var t *time.Timer
	// The posted closure runs on this goroutine, after t is assigned.
	t = time.AfterFunc(delay, func() {
		d.post(func() {
			delete(d.timers, t)
			fn()
		})
	})
	d.timers[t] = struct{}{}
}

func (d *dispatcher) run() {
	defer d.finish()
	d.startSync()
	d.c.publish(d.cn)
	// Pushes wait in the queue until the snapshot is applied, so nothing
	// reaches the application ahead of it.
	for d.syncLeft > 0 && !d.dead {
		select {
		case <-d.cn.stop:
			return
		case <-d.wake:
			d.runMail()
		case <-d.flushC:
			d.flush()
		}
	}
	d.flush()
	hello := d.cn.hello
	d.emit(Event{Kind: EventConnected, Hello: &hello})
	for !d.dead {
		select {
		case <-d.cn.stop:
			return
		case <-d.wake:
			d.runMail()
		case f := <-d.cn.pushes:
			d.onPush(f)
		case <-d.flushC:
			d.flush()
		}
		if d.cn.overflow.Load() && len(d.cn.pushes) == 0 {
			d.cn.overflow.Store(false)
			d.log.Info("client: caught up after dropped pushes; re-fetching")
			d.catchUp = true
			d.list()
		}
	}
}

// finish stops timers and saves positions that were handed over but not yet
// acknowledged, so the next connection syncs from them.
func (d *dispatcher) finish() {
	for t := range d.timers {
		t.Stop()
	}
	if d.flushT != nil {
		d.flushT.Stop()
	}
	d.saveDirty()
}

// emit hands ev to the application. While it waits it keeps flushing
// delivered acknowledgements so a slow application does not make the server
// re-send what was already handed over. After the first failure nothing more
// is emitted on this connection, so the application never sees a hole.
func (d *dispatcher) emit(ev Event) bool {
	if d.dead {
		return false
	}
	for {
		select {
		case d.c.events <- ev:
			return true
		case <-d.cn.stop:
			d.dead = true
			return false
		case <-d.flushC:
			d.flush()
		}
	}
}

func (d *dispatcher) deliver(convID uint64, msgs []protocol.Message) bool {
	for i := range msgs {
		m := msgs[i]
		if !d.emit(Event{Kind: EventMessage, ConvID: convID, Message: &m}) {
			return false
		}
		d.c.setPosition(convID, m.Seq)
		d.dirty[convID] = m.Seq
	}
	if len(msgs) > 0 {
		d.armFlush(d.ackDelay(convID))
	}
	return true
}

// ackDelay is how soon what was handed over in convID is to be saved and
// acknowledged, by the ack policy of its last push: promptly by default
// (delivered receipts), within batchDelay for a medium group, and a large
// group's (never acknowledged) is only saved, on the same slow timer.
func (d *dispatcher) ackDelay(convID uint64) time.Duration {
	if o := d.conv[convID]; o != nil && o.ack != "" {
		return batchDelay
	}
	return deliveredDelay
}

// armFlush makes sure a flush fires within delay.
func (d *dispatcher) armFlush(delay time.Duration) {
	at := time.Now().Add(delay)
	if d.flushC != nil {
		if !at.Before(d.flushAt) {
			return
		}
		d.flushT.Stop()
	}
	d.flushT = time.NewTimer(delay)
	d.flushC, d.flushAt = d.flushT.C, at
}

func (d *dispatcher) saveDirty() {
	if len(d.dirty) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.c.cfg.RequestTimeout)
	defer cancel()
	for convID, seq := range d.dirty {
		if err := d.c.cfg.State.Save(ctx, convID, seq); err != nil {
			d.log.Warn("client: save position", "conv_id", convID, "seq", seq, "err", err)
		}
	}
}

// flush persists and acknowledges everything handed over since the last
// flush: the position is saved before the server is told, so the server
// never believes this device has something its store does not record.
// Every position goes in one delivered frame (several frames only past
// max_sync_convs); a large group's (ack "none") is saved, never sent.
func (d *dispatcher) flush() {
	if d.flushT != nil {
		d.flushT.Stop()
	}
	d.flushT, d.flushC = nil, nil
	d.saveDirty()
	var ps []protocol.Position
	for convID, seq := range d.dirty {
		if o := d.conv[convID]; o == nil || o.ack != protocol.AckNone {
			ps = append(ps, protocol.Position{ConvID: convID, Seq: seq})
		}
		delete(d.dirty, convID)
	}
	for len(ps) > 0 {
		n := min(len(ps), d.cn.limits().MaxSyncConvs)
		if n == 1 {
			d.cn.enqueue(protocol.Frame{Type: protocol.TypeDelivered, ConvID: ps[0].ConvID, Seq: ps[0].Seq})
		} else {
			d.cn.enqueue(protocol.Frame{Type: protocol.TypeDelivered, Positions: ps[:n:n]})
		}
		ps = ps[n:]
	}
}

func (d *dispatcher) order(convID uint64) *convOrder {
	o := d.conv[convID]
	if o == nil {
		last, known := d.c.position(convID)
		o = newConvOrder(last, known)
		d.conv[convID] = o
	}
	return o
}

// startSync sends the (re)connect sync: every known position, all:true so
// conversations this device never saw come from the read position. Lists
// longer than the server's max_sync_convs go out in several requests.
func (d *dispatcher) startSync() {
	for _, f := range syncFrames(d.c.positions(), d.cn.limits().MaxSyncConvs) {
		d.syncLeft++
		d.sendSync(f)
	}
	if users := d.c.watched(); len(users) > 0 {
		d.resubscribe(users)
	}
}

// resubscribe sends the presence watch list again: the server keeps it
// per connection. The answer (current states) is handed over as an
// EventPresence, after the sync's events.
func (d *dispatcher) resubscribe(users []string) {
	d.request(protocol.Frame{Type: protocol.TypePresenceSub, Users: users}, func(r *protocol.Frame, err error) {
		switch {
		case err == errConnGone:
		case err != nil:
			d.later(dispatchRetry, func() { d.resubscribe(users) })
		case r.Type == protocol.TypeError:
			e := errorFromFrame(r)
			if e.Retryable() {
				d.later(retryDelay(e), func() { d.resubscribe(users) })
				return
			}
			d.log.Warn("client: presence watch refused", "code", string(e.Code), "err", e.Msg)
		default:
			d.emit(Event{Kind: EventPresence, Presence: r.States})
		}
	})
}

func (d *dispatcher) sendSync(f protocol.Frame) {
	d.request(f, func(r *protocol.Frame, err error) {
		switch {
		case err == errAttemptTimeout:
			d.cn.fail(err) // a connection that cannot answer a sync is sick
		case err != nil:
		case r.Type == protocol.TypeError:
			e := errorFromFrame(r)
			if !e.Retryable() {
				d.log.Error("client: sync refused", "code", string(e.Code), "err", e.Msg)
				d.cn.fail(e)
				return
			}
			d.later(retryDelay(e), func() { d.sendSync(f) })
		default:
			d.applySnapshot(r.Snapshot)
			d.syncLeft--
		}
	})
}

func retryDelay(e *Error) time.Duration {
	if e.RetryAfter > 0 {
		return e.RetryAfter
	}
	return dispatchRetry
}

// applySnapshot hands over each conversation of a snapshot: a Snapshot
// event, then its messages through the conversation's ordering.
func (d *dispatcher) applySnapshot(snaps []protocol.ConvSnapshot) {
	for i := range snaps {
		s := snaps[i]
		o := d.order(s.ConvID)
		var ready []protocol.Message
		if !o.known || s.FromSeq > o.last {
			// The server starts this member here (read position, or
			// join_seq-1): seqs before it are not ours to see.
			d.log.Debug("client: starting point from a snapshot", "conv_id", s.ConvID, "from_seq", s.FromSeq, "known", o.known, "last", o.last)
			ready, _ = o.jumpTo(s.FromSeq)
		}
		var skipped uint64
		if s.MoreUnread > 0 && len(s.Messages) > 0 {
			var more []protocol.Message
			more, skipped = o.jumpTo(s.Messages[0].Seq - 1)
			ready = append(ready, more...)
		}
		head := s
		head.Messages = nil
		if !d.emit(Event{Kind: EventSnapshot, ConvID: s.ConvID, Snapshot: &head, Skipped: skipped}) {
			return
		}
		for _, m := range s.Messages {
			ready = append(ready, o.offer(m)...)
		}
		if !d.deliver(s.ConvID, ready) {
			return
		}
		d.maybeFetch(s.ConvID, o)
	}
}

func (d *dispatcher) onPush(f *protocol.Frame) {
	switch f.Type {
	case protocol.TypeKeysLow:
		if f.KeyCounts != nil {
			d.emit(Event{Kind: EventKeysLow, KeysLow: &KeysLow{DeviceID: f.DeviceID, PreKeys: f.KeyCounts.PreKeys, KEMPreKeys: f.KeyCounts.KEMPreKeys}})
		}
	case protocol.TypePresence:
		d.emit(Event{Kind: EventPresence, Presence: f.States})
	case protocol.TypeConvMute:
		d.emit(Event{Kind: EventMute, ConvID: f.ConvID, MuteUntil: f.MuteUntil})
	case protocol.TypeDND:
		if f.DND != nil {
			d.emit(Event{Kind: EventDND, DND: f.DND})
		}
	case protocol.TypeTyping:
		d.emit(Event{Kind: EventTyping, ConvID: f.ConvID, Typing: &Typing{ConvID: f.ConvID, UserID: f.UserID}})
	case protocol.TypeReceipt:
		d.emit(Event{Kind: EventReceipt, ConvID: f.ConvID, Receipt: &Receipt{
			ConvID: f.ConvID, UserID: f.UserID, DeviceID: f.DeviceID, Seq: f.Seq, State: f.State,
		}})
	case protocol.TypeReactions:
		if f.FromSeq == 0 || f.Seq < f.FromSeq || f.Seq-f.FromSeq >= maxPending {
			return
		}
		o := d.order(f.ConvID)
		o.ack = f.Ack
		if !o.known {
			d.list()
			return
		}
		var ready []protocol.Message
		for _, m := range ReactionStubs(f) {
			ready = append(ready, o.offer(m)...)
		}
		if d.deliver(f.ConvID, ready) {
			d.maybeFetch(f.ConvID, o)
		}
	case protocol.TypeMsg:
		m := *f.Message
		o := d.order(m.ConvID)
		o.ack = f.Ack
		if o.known && m.Seq <= o.last {
			d.log.Debug("client: push at or below the position dropped", "conv_id", m.ConvID, "seq", m.Seq, "position", o.last)
		}
		ready := o.offer(m)
		if !o.known {
			// First sight of a conversation the sync did not mention: its
			// starting point comes from the conversation list.
			d.log.Debug("client: push for a conversation without a starting point; listing", "conv_id", m.ConvID, "seq", m.Seq)
			d.list()
			return
		}
		if d.deliver(m.ConvID, ready) {
			d.maybeFetch(m.ConvID, o)
		}
	}
}

func (d *dispatcher) maybeFetch(convID uint64, o *convOrder) {
	if o.needFetch() {
		d.fetch(convID, o)
	}
}

// fetch asks for the page after the conversation's position.
func (d *dispatcher) fetch(convID uint64, o *convOrder) {
	after := o.startFetch()
	f := protocol.Frame{Type: protocol.TypeHistory, ConvID: convID, AfterSeq: &after, Limit: d.cn.limits().MaxHistory}
	d.request(f, func(r *protocol.Frame, err error) {
		switch {
		case err == errConnGone:
			return
		case err != nil:
			o.fetchFailed()
			d.later(dispatchRetry, func() { d.maybeFetch(convID, o) })
			return
		case r.Type == protocol.TypeError:
			o.fetchFailed()
			e := errorFromFrame(r)
			if !e.Retryable() {
				// not_member and the like: this device will never see
				// those seqs; hand over what is held rather than stall.
				d.log.Warn("client: gap fetch refused", "conv_id", convID, "code", string(e.Code), "err", e.Msg)
				d.deliver(convID, o.releaseAll())
				return
			}
			d.later(retryDelay(e), func() { d.maybeFetch(convID, o) })
			return
		}
		ready, again, skipped := o.fill(r.Messages, r.HasMore)
		if skipped > 0 {
			d.log.Debug("client: seqs not visible to this member skipped", "conv_id", convID, "skipped", skipped,
				"after_seq", after, "page", len(r.Messages), "now_at", o.last)
		}
		if !d.deliver(convID, ready) {
			return
		}
		if again && !o.fetching {
			d.fetch(convID, o)
		}
	})
}

// list fetches the conversation list: it gives the starting point (read
// position) of conversations first seen through a push, and after dropped
// pushes it tells which conversations moved on.
func (d *dispatcher) list() {
	if d.listing {
		return
	}
	d.listing = true
	d.request(protocol.Frame{Type: protocol.TypeConvList}, func(r *protocol.Frame, err error) {
		d.listing = false
		switch {
		case err == errConnGone:
			return
		case err != nil:
			d.later(dispatchRetry, d.list)
			return
		case r.Type == protocol.TypeError:
			e := errorFromFrame(r)
			if e.Retryable() {
				d.later(retryDelay(e), d.list)
				return
			}
			d.log.Warn("client: conversation list refused", "code", string(e.Code), "err", e.Msg)
		}
		d.applyList(r.List)
	})
}

func (d *dispatcher) applyList(list []protocol.ConvSummary) {
	catchUp := d.catchUp
	d.catchUp = false
	listed := make(map[uint64]bool, len(list))
	for _, s := range list {
		listed[s.ConvID] = true
		o := d.order(s.ConvID)
		if !o.known && (o.hole() || catchUp) {
			base := s.ReadSeq
			if s.JoinSeq > 0 && s.JoinSeq-1 > base {
				base = s.JoinSeq - 1
			}
			if low := o.minPendingSeq(); low != 0 && low-1 < base {
				// Another device read past this push already; this
				// device still gets it.
				base = low - 1
			}
			d.log.Debug("client: starting point from the conversation list", "conv_id", s.ConvID, "base", base,
				"read_seq", s.ReadSeq, "join_seq", s.JoinSeq, "last_seq", s.LastSeq, "first_held", o.minPendingSeq())
			ready, _ := o.jumpTo(base)
			// The application learns the starting point as it does from a
			// sync: an EventSnapshot without messages, then the messages.
			start := &protocol.ConvSnapshot{ConvID: s.ConvID, Kind: s.Kind, LastSeq: s.LastSeq, ReadSeq: s.ReadSeq,
				JoinSeq: s.JoinSeq, Unread: s.Unread, FromSeq: base}
			if !d.emit(Event{Kind: EventSnapshot, ConvID: s.ConvID, Snapshot: start}) || !d.deliver(s.ConvID, ready) {
				return
			}
		}
		if o.known && catchUp && s.LastSeq > o.last && !o.fetching {
			d.fetch(s.ConvID, o)
			continue
		}
		d.maybeFetch(s.ConvID, o)
	}
	for convID, o := range d.conv {
		if !o.known && o.hole() && !listed[convID] {
			// Not in the list (just left, or the list lags): hand over what
			// was pushed rather than hold it forever.
			d.log.Debug("client: conversation not in the list; handing over what was pushed", "conv_id", convID, "first_held", o.minPendingSeq())
			// No EventSnapshot: without the list's entry there is nothing
			// to describe the conversation with.
			ready, _ := o.jumpTo(o.minPendingSeq() - 1)
			if !d.deliver(convID, ready) {
				return
			}
			d.maybeFetch(convID, o)
		}
	}
}
