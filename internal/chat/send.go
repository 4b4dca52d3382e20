package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// send stores a message or an edit/recall event and acknowledges it.
// Order of work: membership → seq + durable write → ack → fan-out.
// A failed write is reported and nothing is acknowledged; a failed fan-out
// never undoes the stored message.
func (s *Service) send(ctx context.Context, c Caller, f *protocol.Frame, reply func(*protocol.Frame)) *protocol.Error {
	start := s.now()
	cv, own, perr := s.sendReads(ctx, c, f.ConvID)
	if perr != nil {
		return perr
	}
	if perr := s.sendAllowed(ctx, c, cv, f); perr != nil {
		return perr
	}
	a := s.appendOf(c, cv, f, start)
	res, err := s.store.Append(ctx, a)
	if err != nil {
		return s.storeErr("append", err)
	}
	if s.obs.Stored != nil && !res.Duplicate {
		s.obs.Stored(s.now().Sub(start))
	}
	stored := res.Msg
	passed := s.ownReadRaised(ctx, c, own, res)
	reply(&protocol.Frame{
		Type: protocol.TypeAck, RID: f.RID, ConvID: stored.ConvID, ClientMsgID: stored.ClientMsgID,
		Seq: stored.Seq, MsgID: stored.MsgID, ServerTime: stored.ServerTime, Duplicate: res.Duplicate,
	})
	if passed {
		s.receipt(ctx, c, cv, stored.Seq, protocol.StateRead, true)
	}
	// The fan-out runs on the outbox workers, off this request: the
	// store's outbox entry, written with the message, covers it if this
	// process dies first. A duplicate is fanned out again: the first
	// fan-out's pushes may have been lost with the connection that made
	// the client retry. Rows are idempotent and devices drop repeated seqs.
	s.outbox.Enqueue(fanout.Job{Msg: stored, RowsWritten: res.RowsWritten, Conv: &cv})
	return nil
}

// ownPos is the caller's read position before its message, if known.
type ownPos struct {
	seq   uint64
	known bool
}

// sendReads reads what a send checks before its append: the
// conversation, the caller's membership and the caller's read position
// (to tell whether its message passes over others'). The three reads
// overlap — one round trip before the append over the network, not three
// — and what this process remembers is not read again: a direct
// conversation and its membership (directConv), the read position
// (ownRead).
func (s *Service) sendReads(ctx context.Context, c Caller, conv uint64) (store.Conversation, ownPos, *protocol.Error) {
	var (
		cv    store.Conversation
		known bool
		own   ownPos
		cvErr error
		wg    sync.WaitGroup
	)
	if !c.Admin {
		cv, known = s.directConv(conv, c.User)
		own.seq, own.known = s.ownRead(c.User, s.readDevice(c), conv)
		if !own.known {
			wg.Go(func() { own = s.readOwnPos(ctx, c, conv) })
		}
	}
	if !known {
		wg.Go(func() { cv, cvErr = s.store.Conversation(ctx, conv) })
	}
	var perr *protocol.Error
	if !c.Admin && !known {
		// The admin (moderation edit and recall, admin.go) is no member:
		// its authority replaces the membership check.
		perr = s.sender(ctx, c.User, conv)
	}
	wg.Wait()
	switch {
	case perr != nil:
		return cv, own, perr
	case cvErr != nil:
		return cv, own, s.storeErr("conversation", cvErr)
	}
	if !known {
		s.rememberDirect(cv)
	}
	return cv, own, nil
}

// readOwnPos reads the caller's read position in conv and remembers it.
func (s *Service) readOwnPos(ctx context.Context, c Caller, conv uint64) ownPos {
	dev := s.readDevice(c)
	seq, err := s.store.Read(ctx, c.User, dev, conv)
	if err != nil {
		return ownPos{}
	}
	s.sawRead(c.User, dev, conv, seq)
	return ownPos{seq: seq, known: true}
}

// sender checks that user may send to conv: a current member, not muted.
func (s *Service) sender(ctx context.Context, user string, conv uint64) *protocol.Error {
	m, perr := s.member(ctx, user, conv)
	switch {
	case perr != nil:
		return perr
	case m.LeaveSeq != 0:
		return protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	case m.Muted:
		return protocol.Errorf(protocol.CodeForbidden, "muted in this conversation")
	}
	return nil
}

// sendAllowed applies the checks of the conversation's kind: what an
// end-to-end encrypted conversation accepts, and @everyone's limit.
func (s *Service) sendAllowed(ctx context.Context, c Caller, cv store.Conversation, f *protocol.Frame) *protocol.Error {
	if c.Admin && cv.E2E && f.Type != protocol.TypeRecall {
		return protocol.Errorf(protocol.CodeE2EUnsupported, "the server never produces the body of an end-to-end encrypted conversation: moderation can recall, not edit")
	}
	if perr := checkE2E(cv, f); perr != nil {
		return perr
	}
	if !f.MentionAll {
		return nil
	}
	if cv.Kind != store.Group {
		return protocol.Errorf(protocol.CodeInvalidArgument, "mention_all is for groups")
	}
	ok, wait, err := s.limits.Allow(ctx, "everyone:"+strconv.FormatUint(cv.ID, 10), s.cfg.EveryoneInterval)
	if err != nil {
		return &protocol.Error{Code: protocol.CodeOverloaded, Msg: "rate limiter unavailable", RetryAfter: 1000}
	}
	if !ok {
		return &protocol.Error{Code: protocol.CodeRateLimited, Msg: "@everyone is limited per group", RetryAfter: max(wait.Milliseconds(), 1)}
	}
	return nil
}

// appendOf is the store write of f.
func (s *Service) appendOf(c Caller, cv store.Conversation, f *protocol.Frame, now time.Time) store.Append {
	a := store.Append{
		Msg: store.Message{
			ConvID: f.ConvID, MsgID: s.ids.Next(), Sender: c.User, SenderDevice: c.Device,
			ClientMsgID: f.ClientMsgID, Kind: f.Kind, Body: f.Body, TargetSeq: f.TargetSeq,
			ServerTime: now.UnixMilli(), Mentions: f.Mentions, MentionAll: f.MentionAll, CoalesceKey: scopedKey(c.User, f.CoalesceKey),
		},
	}
	if f.TargetSeq != 0 {
		a.Check = s.checkTarget(c, f)
	}
	if !c.Admin {
		// The sender has seen what it sent: the store raises its read
		// position with the message.
		a.ReadBy = &store.Reader{User: c.User, Device: s.readDevice(c)}
	}
	// Direct conversations and small groups of a few members get their
	// rows in the message's own write: no second write (and fsync) per
	// message, and the rows are never behind the message.
	a.Rows = cv.Kind == store.Direct || (s.cfg.tierFor(cv.Tier, cv.Members) == TierSmall && cv.Members <= s.cfg.InlineRows)
	return a
}

// ownReadRaised makes sure the sender's read position is at its message
// before the ack, so that no conv_list after the ack counts the user's own
// message as unread, and reports whether the move passed over earlier
// messages (the `read` receipt is then due). The store raised it with the
// append (res.ReadRaised) unless the message is a duplicate — repeated
// here, in case the first attempt died between the two writes — or the
// position's write failed.
func (s *Service) ownReadRaised(ctx context.Context, c Caller, own ownPos, res store.AppendResult) bool {
	m := res.Msg
	if !res.ReadRaised {
		return s.readOwn(ctx, c, m.ConvID, m.Seq)
	}
	s.sawRead(c.User, s.readDevice(c), m.ConvID, m.Seq)
	return own.known && own.seq+1 < m.Seq
}

// FanOut makes a stored message visible (the outbox's handler):
// conversation rows by tier, mention rows in every tier, and pushes
// to the online devices of members who may see it. Failures of row
// writes and pushes become compensation tasks; an error is returned only
// when something could neither be done nor recorded, and the outbox then
// retries the message.
func (s *Service) FanOut(ctx context.Context, j fanout.Job) error {
	m := j.Msg
	var cv store.Conversation
	if j.Conv != nil && j.Conv.ID == m.ConvID {
		cv = *j.Conv
	} else {
		var err error
		if cv, err = s.store.Conversation(ctx, m.ConvID); err != nil {
			return fmt.Errorf("conversation: %w", err)
		}
	}
	tier := s.tier(ctx, cv)
	var recipients []string
	var err error
	if cv.Kind == store.Direct {
		// Both members see every message, and they never change.
		recipients, err = s.directMembers(ctx, cv.ID)
	} else {
		recipients, err = s.recipients(ctx, cv.ID, tier, m.Seq)
	}
	if err != nil {
		return fmt.Errorf("recipients: %w", err)
	}
	// Pushes first, rows after: no read path takes last_seq from a row
	// (sync, conv_list and unread read the conversation), so the
	// recipients need not wait for the rows' durable write — in the medium
	// tier one row per member online, synced — to get the message. The
	// entry is cleared only once both are done or recorded, as before.
	wm := wireMessage(m)
	rc := s.collectReached(m)
	pushed, err := s.pushFrame(ctx, recipients, &protocol.Frame{Type: protocol.TypeMsg, Message: &wm}, m.ConvID, m.Seq, m.CoalesceKey, rc)
	if err != nil {
		return err
	}
	rows := 0
	if j.RowsWritten {
		// The append wrote every member's row with the message (direct
		// conversations and the smallest groups): counted here, so the
		// per-tier row-write figures stay whole.
		rows = len(recipients)
	} else {
		if tier != TierLarge {
			// Small: every member (all are recipients); medium: members
			// online. @everyone marks them too (and is remembered on the
			// conversation for everyone else).
			n, err := s.writeRows(ctx, cv.ID, m.Seq, recipients, m.MentionAll)
			if err != nil {
				return err
			}
			rows = n
		}
		if !m.MentionAll && len(m.Mentions) > 0 {
			// Explicit mentions reach offline members too, in every tier;
			// the store skips users who are not members.
			if _, err := s.writeRows(ctx, cv.ID, m.Seq, m.Mentions, true); err != nil {
				return err
			}
		}
	}
	if s.hook != nil {
		if err := s.hookFanned(ctx, m, cv, tier, recipients, rc); err != nil {
			return err
		}
	}
	if s.obs.Fanout != nil {
		s.obs.Fanout(TierName(tier), rows, pushed)
	}
	return nil
}

// recipients are the members allowed to see seq: every member in a small
// group; in larger tiers only the online ones, found through the online
// index so the cost follows the members online, not the group's size.
func (s *Service) recipients(ctx context.Context, conv uint64, tier uint8, seq uint64) ([]string, error) {
	if tier == TierSmall {
		members, err := s.store.Members(ctx, conv)
		if err != nil {
			return nil, err
		}
		out := make([]string, 0, len(members))
		for _, mb := range members {
			if mb.JoinSeq <= seq {
				out = append(out, mb.UserID)
			}
		}
		return out, nil
	}
	online, ok := s.online.GroupOnline(conv)
	if !ok {
		return nil, fmt.Errorf("group %d is not tracked", conv)
	}
	// The index carries each member's join_seq (nothing below it is
	// pushed); it learns joins from AddMembers' result before their event
	// is sent, and forgets a member when it leaves, so no membership is
	// read per recipient.
	out := make([]string, 0, len(online))
	for _, m := range online {
		if m.JoinSeq <= seq {
			out = append(out, m.UserID)
		}
	}
	return out, nil
}

// writeRows is write fan-out; a failure becomes a compensation task, and
// an error is returned only if that cannot be recorded either.
func (s *Service) writeRows(ctx context.Context, conv, seq uint64, users []string, mention bool) (int, error) {
	if len(users) == 0 {
		return 0, nil
	}
	if err := s.store.UpdateRows(ctx, conv, seq, users, mention); err != nil {
		s.log.Warn("row fan-out failed; recorded for retry", "conv", conv, "seq", seq, "users", len(users), "err", err)
		if rerr := s.record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: conv, Seq: seq, Users: users, Mention: mention}); rerr != nil {
			return 0, fmt.Errorf("rows: %w; and the ledger: %w", err, rerr)
		}
		return 0, nil
	}
	return len(users), nil
}

func (s *Service) record(ctx context.Context, t ledger.Task) error {
	err := s.ledger.Record(context.WithoutCancel(ctx), t)
	if err != nil {
		s.log.Error("compensation ledger failed", "kind", t.Kind, "conv", t.Conv, "seq", t.Seq, "err", err)
	}
	return err
}

// Compensate redoes a recorded task; the ledger retries it until it
// returns nil.
func (s *Service) Compensate(ctx context.Context, t ledger.Task) error {
	switch t.Kind {
	case ledger.KindRows:
		if err := s.store.UpdateRows(ctx, t.Conv, t.Seq, t.Users, t.Mention); err != nil {
			return err
		}
	case ledger.KindPush:
		msgs, err := s.store.Messages(ctx, t.Conv, t.Seq, t.Seq, 1)
		if err != nil {
			return err
		}
		if len(msgs) == 1 {
			wm := wireMessage(msgs[0])
			data, err := json.Marshal(&protocol.Frame{Type: protocol.TypeMsg, Message: &wm})
			if err != nil {
				return err
			}
			err = s.bus.Publish(ctx, t.Node, bus.Delivery{Users: t.Users, Frame: data, ConvID: t.Conv, Seq: t.Seq})
			if err != nil && !errors.Is(err, bus.ErrNoSubscriber) {
				return err
			}
		}
	default:
		s.log.Error("unknown compensation task dropped", "kind", t.Kind)
	}
	if s.obs.Compensated != nil {
		s.obs.Compensated(t.Kind)
	}
	return nil
}

// checkTarget enforces who may edit or recall what, and rewrites the target.
func (s *Service) checkTarget(c Caller, f *protocol.Frame) func(store.Message) (store.Message, error) {
	now := s.now()
	return func(t store.Message) (store.Message, error) {
		switch {
		case t.Kind != protocol.KindText:
			return t, protocol.Errorf(protocol.CodeConflict, "only text messages can be edited or recalled")
		case t.Recalled && c.Admin:
			return t, protocol.Errorf(protocol.CodeConflict, "message %d is recalled", t.Seq)
		case c.Admin:
			// Moderation: any sender's message, whatever its age.
		case t.Sender != c.User:
			return t, protocol.Errorf(protocol.CodeForbidden, "only the sender can edit or recall a message")
		case t.Recalled:
			return t, protocol.Errorf(protocol.CodeConflict, "message %d is recalled", t.Seq)
		case now.Sub(time.UnixMilli(t.ServerTime)) > s.cfg.RecallWindow:
			return t, &protocol.Error{Code: protocol.CodeRecallExpired, Msg: "the edit and recall window has passed"}
		}
		if f.Kind == protocol.KindRecall {
			t.Recalled, t.Body = true, ""
		} else {
			t.Edited, t.Body = true, f.Body
		}
		return t, nil
	}
}

// push sends frame to every online device of users, one bus delivery per
// gateway node, and returns the number of users handed off. It is
// for frames without a seq (receipts, typing, notices): those are best
// effort, and a failure is only logged.
func (s *Service) push(ctx context.Context, users []string, frame *protocol.Frame, conv, seq uint64) int {
	n, err := s.pushFrame(ctx, users, frame, conv, seq, "", nil)
	if err != nil {
		s.log.Warn("push failed", "type", frame.Type, "conv", conv, "err", err)
	}
	return n
}

// pushFrame encodes frame once and hands it to every gateway node that
// holds a device of users, the nodes concurrently. For a message (seq ≠ 0),
// a node that cannot be reached right now gets a compensation task, and an
// error is returned when the registry cannot be read or a task cannot be
// recorded, so the outbox retries; a node with no subscriber has gone, and
// its users resync on whichever node they reconnect to. A non-nil rc
// collects the users whose node took the push (webhooks).
func (s *Service) pushFrame(ctx context.Context, users []string, frame *protocol.Frame, conv, seq uint64, key string, rc *reached) (int, error) {
	if len(users) == 0 {
		return 0, nil
	}
	online, err := s.reg.Lookup(ctx, users)
	if err != nil {
		if s.obs.PushFailed != nil {
			s.obs.PushFailed()
		}
		return 0, fmt.Errorf("registry lookup: %w", err)
	}
	if len(online) == 0 {
		return 0, nil
	}
	// In the order of users, not of the map: a group's consecutive
	// messages then reach a gateway with the same recipient list, which
	// lets it write a backlog of them to each connection at once
	// (gateway.writeBatch).
	byNode := make(map[string][]string, 1)
	for _, u := range users {
		entries := online[u]
		for _, e := range entries {
			if l := byNode[e.Node]; len(l) == 0 || l[len(l)-1] != u {
				byNode[e.Node] = append(l, u)
			}
		}
	}
	data, err := json.Marshal(frame)
	if err != nil {
		return 0, fmt.Errorf("encode push: %w", err)
	}
	publish := func(node string, us []string) (int, error) {
		err := s.bus.Publish(ctx, node, bus.Delivery{Users: us, Frame: data, ConvID: conv, Seq: seq, CoalesceKey: key})
		if err == nil {
			rc.add(us)
			return len(us), nil
		}
		if s.obs.PushFailed != nil {
			s.obs.PushFailed()
		}
		if seq == 0 || errors.Is(err, bus.ErrNoSubscriber) {
			return 0, nil
		}
		s.log.Warn("push hand-off failed; recorded for retry", "node", node, "err", err)
		if rerr := s.record(ctx, ledger.Task{Kind: ledger.KindPush, Conv: conv, Seq: seq, Users: us, Node: node}); rerr != nil {
			return 0, fmt.Errorf("push to %s: %w; and the ledger: %w", node, err, rerr)
		}
		return 0, nil
	}
	var (
		n    int
		errs []error
	)
	if len(byNode) == 1 {
		for node, us := range byNode {
			n, err = publish(node, us)
			errs = append(errs, err)
		}
	} else {
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		for node, us := range byNode {
			wg.Go(func() {
				k, err := publish(node, us)
				mu.Lock()
				n += k
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	if s.obs.Pushed != nil {
		s.obs.Pushed(n)
	}
	return n, errors.Join(errs...)
}

// readOwn raises the caller's read position (per user, or per device
// under ReadPerDevice) to seq, a message (text, state, edit, recall) the
// caller has just stored, so that a user's own messages never count as
// unread. It
// reports whether the position passed over earlier messages (it was below
// seq-1): the user answered without reading them first, and the caller
// then sends the `read` receipt a `read` frame would. A position already
// at seq-1 (the user's previous message, or everything read) moves
// silently. A failure is logged and the message stays stored: the next
// `read` or send repairs the position.
func (s *Service) readOwn(ctx context.Context, c Caller, conv, seq uint64) bool {
	if c.Admin {
		return false // the admin authority is no member: it has no read position
	}
	dev := s.readDevice(c)
	before, err := s.store.Read(ctx, c.User, dev, conv)
	if err == nil && before >= seq {
		return false
	}
	if err == nil {
		_, err = s.store.SetRead(ctx, c.User, dev, conv, seq)
	}
	if err != nil {
		s.log.Warn("own read position not raised", "conv", conv, "seq", seq, "user", c.User, "err", err)
		return false
	}
	s.sawRead(c.User, dev, conv, seq)
	return before+1 < seq
}

// readOwnEvent moves the caller's read position over a system event the
// caller caused (a membership change, a device's key change) only when
// the caller had read everything before it: an administrative action, or
// a key upload running in the background, is no sign of having read
// others' messages, so it never marks them read and sends no receipt.
func (s *Service) readOwnEvent(ctx context.Context, c Caller, conv, seq uint64) {
	if c.Admin {
		return // the admin authority is no member: it has no read position
	}
	dev := s.readDevice(c)
	before, err := s.store.Read(ctx, c.User, dev, conv)
	if err == nil && before+1 == seq {
		_, err = s.store.SetRead(ctx, c.User, dev, conv, seq)
	}
	if err != nil {
		s.log.Warn("own read position not raised", "conv", conv, "seq", seq, "user", c.User, "err", err)
	}
}
