package chat

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/fanout"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// send stores a message or an edit/recall event and acknowledges it.
// Order of work: membership → seq + durable write → ack → fan-out.
// A failed write is reported and nothing is acknowledged; a failed fan-out
// never undoes the stored message.
func (s *Service) send(ctx context.Context, c Caller, f *protocol.Frame, reply func(*protocol.Frame)) *protocol.Error {
	if perr := s.shed(); perr != nil {
		return perr
	}
	start := s.now()
	cv, own, perr := s.sendReads(ctx, c, f.ConvID)
	if perr != nil {
		return perr
	}
	if perr := s.sendAllowed(ctx, c, cv, f); perr != nil {
		return perr
	}
	if f.ReplyTo != 0 {
		if perr := s.checkReply(ctx, c, cv, f.ReplyTo); perr != nil {
			return perr
		}
	}
	a := s.appendOf(c, cv, f, start)
	// recalled is the attachment of a recalled file message, read from
	// the target when the store applies the recall.
	var recalled uint64
	// target is a reaction's target as the store saw it, for its counts
	// after the event.
	var target *store.Message
	switch {
	case f.Type == protocol.TypeReact:
		check, perr := s.prepareReact(ctx, c, cv, f)
		if perr != nil {
			return perr
		}
		// The event's body is its emoji.
		a.React, a.Msg.Body = &store.React{Emoji: f.Emoji, Remove: f.Remove}, f.Emoji
		a.Check = func(t store.Message) (store.Message, error) {
			t, err := check(t)
			if err == nil {
				target = &t
			}
			return t, err
		}
	case f.TargetSeq != 0:
		a.Check = s.checkTarget(c, f, &recalled)
	}
	if f.Kind == protocol.KindFile {
		if s.attach == nil {
			return protocol.Errorf(protocol.CodeInvalidArgument, "attachments are not enabled on this server")
		}
		body, id, perr := s.attach.Attach(ctx, c.User, cv, f, s.cfg.Limits.MaxBodyBytes)
		if perr != nil {
			return perr
		}
		a.Msg.Body, a.Msg.Attachment = body, id
	}
	res, err := s.store.Append(ctx, a)
	if err != nil {
		if a.React != nil {
			return s.reactErr(err)
		}
		return s.storeErr("append", err)
	}
	if s.obs.Stored != nil && !res.Duplicate {
		s.obs.Stored(s.now().Sub(start))
	}
	stored := res.Msg
	if s.attach != nil && stored.Kind == protocol.KindFile && stored.Attachment != 0 {
		// Before the ack, so that from then on the record names its
		// message's seq (the server API lists it).
		s.attach.Stored(ctx, stored.Attachment, stored.Seq)
	}
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
	j := fanout.Job{Msg: stored, RowsWritten: res.RowsWritten, Conv: &cv, Members: s.directRecipients(ctx, cv)}
	if target != nil && !res.Duplicate {
		// The counts after the event, as the store applied it (a
		// duplicate's are read by the fan-out).
		after, _, err := store.ApplyReact(*target, reactorBefore(*a.React), *a.React)
		if err == nil {
			j.Reactions = &after.Reactions
		}
	}
	s.fan.Enqueue(j)
	if s.attach != nil && recalled != 0 && !res.Duplicate {
		// The file goes with its message: nobody can download it any
		// more (the message is recalled), and its bytes are deleted now
		// rather than kept for no one.
		s.attach.Recalled(ctx, recalled)
	}
	return nil
}

// shed answers overloaded, before anything is read or stored, while this
// process's fan-out is further behind its ACKs than MaxFanoutLag: a sender
// then waits (retry_after_ms: the excess, 100 ms to 5 s) rather than get
// an ACK for a message that would reach its recipients ever later. The
// lag is the fan-out's load (LoadLag): a registry or bus outage, which
// fails fan-outs and retries them, does not stop sends, which it would not
// speed up.
func (s *Service) shed() *protocol.Error {
	if s.cfg.MaxFanoutLag <= 0 {
		return nil
	}
	lag := s.fan.LoadLag()
	if lag <= s.cfg.MaxFanoutLag {
		return nil
	}
	if s.obs.Shed != nil {
		s.obs.Shed()
	}
	wait := min(max(lag-s.cfg.MaxFanoutLag, 100*time.Millisecond), 5*time.Second)
	return &protocol.Error{Code: protocol.CodeOverloaded, RetryAfter: wait.Milliseconds(),
		Msg: "delivery is " + lag.Round(100*time.Millisecond).String() + " behind the acknowledgements (chat.max_fanout_lag " + s.cfg.MaxFanoutLag.String() + "); retry later"}
}

// directRecipients are the two members of direct conversation cv, for its
// fan-out (nil for a group, or when they cannot be read: the fan-out reads
// them). Read once per process (directMembers), they also let the next
// sends skip reading the conversation and membership (rememberDirect).
func (s *Service) directRecipients(ctx context.Context, cv store.Conversation) []string {
	if cv.Kind != store.Direct {
		return nil
	}
	members, err := s.directMembers(ctx, cv.ID)
	if err != nil {
		s.log.Warn("direct members not read; left to the fan-out", "conv", cv.ID, "err", err)
		return nil
	}
	s.rememberDirect(cv)
	return members
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
			ServerTime: now.UnixMilli(), Mentions: f.Mentions, MentionAll: f.MentionAll, CoalesceKey: fanout.ScopedKey(c.User, f.CoalesceKey),
			ReplyTo: f.ReplyTo,
		},
	}
	if !c.Admin {
		// The sender has seen what it sent: the store raises its read
		// position with the message.
		a.ReadBy = &store.Reader{User: c.User, Device: s.readDevice(c)}
	}
	// Direct conversations and small groups of a few members get their
	// rows in the message's own write: no second write (and fsync) per
	// message, and the rows are never behind the message.
	a.Rows = cv.Kind == store.Direct || (s.fan.TierFor(cv.Tier, cv.Members) == fanout.TierSmall && cv.Members <= s.cfg.InlineRows)
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

// checkTarget enforces who may edit or recall what, and rewrites the
// target. A recalled file message loses its attachment, whose id it
// leaves in *recalled for the deletion after the write.
func (s *Service) checkTarget(c Caller, f *protocol.Frame, recalled *uint64) func(store.Message) (store.Message, error) {
	now := s.now()
	return func(t store.Message) (store.Message, error) {
		*recalled = 0
		switch {
		case t.Kind == protocol.KindFile && f.Kind != protocol.KindRecall:
			return t, protocol.Errorf(protocol.CodeConflict, "a file message cannot be edited: recall it and send another")
		case t.Kind != protocol.KindText && t.Kind != protocol.KindFile:
			return t, protocol.Errorf(protocol.CodeConflict, "only text and file messages can be edited or recalled")
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
			*recalled = t.Attachment
			t.Recalled, t.Body, t.Attachment = true, "", 0
		} else {
			t.Edited, t.Body = true, f.Body
		}
		return t, nil
	}
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
