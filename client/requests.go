package client

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/parley-im/parley/protocol"
)

// retryPolicy says which failures of one attempt may be retried.
type retryPolicy int

const (
	// idempotent requests are repeated across timeouts and reconnects:
	// send/edit/recall carry a client_msg_id the server deduplicates, the
	// rest read or set state to the same value again.
	idempotent retryPolicy = iota
	// once requests (create_group) are repeated only when the server said
	// it did nothing; an unknown outcome is returned as ErrDisconnected or
	// ErrTimeout.
	once
)

// do sends f until an answer of type want arrives, ctx ends, or a failure
// the policy does not retry. Server errors come back as *Error. It returns
// the connection that answered.
func (c *Client) do(ctx context.Context, f protocol.Frame, want string, policy retryPolicy) (*protocol.Frame, *conn, error) {
	var avoid *conn
	for attempt := 0; ; attempt++ {
		cn, err := c.waitConn(ctx, avoid)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", f.Type, err)
		}
		if max := cn.hello.Limits.MaxBodyBytes; max > 0 && len(f.Body) > max {
			return nil, nil, &Error{Code: protocol.CodeTooLarge, Msg: fmt.Sprintf("body of %d bytes is over %d", len(f.Body), max)}
		}
		r, err := cn.call(ctx, f)
		switch {
		case err == nil && r.Type == want:
			return r, cn, nil
		case err == nil && r.Type == protocol.TypeError:
			e := errorFromFrame(r)
			if !e.Retryable() || (policy == once && e.Code == protocol.CodeInternal) {
				return nil, nil, e
			}
			delay := e.RetryAfter
			if delay == 0 {
				delay = c.bo.delay(attempt)
			}
			c.log.Debug("client: retrying", "type", f.Type, "code", string(e.Code), "delay", delay)
			if !sleep(ctx, delay) {
				return nil, nil, fmt.Errorf("%s: %w (last answer: %w)", f.Type, ctx.Err(), e)
			}
		case err == nil:
			return nil, nil, fmt.Errorf("%s: unexpected answer %q", f.Type, r.Type)
		case ctx.Err() != nil:
			return nil, nil, fmt.Errorf("%s: %w", f.Type, ctx.Err())
		case errors.Is(err, errConnGone):
			if policy == once {
				return nil, nil, fmt.Errorf("%s: %w", f.Type, ErrDisconnected)
			}
			avoid = cn
		case errors.Is(err, errAttemptTimeout):
			if policy == once {
				return nil, nil, fmt.Errorf("%s: %w", f.Type, ErrTimeout)
			}
			c.log.Debug("client: request timed out; retrying", "type", f.Type)
		default:
			return nil, nil, fmt.Errorf("%s: %w", f.Type, err)
		}
	}
}

// Send stores body as a new text message in convID. It picks a fresh
// client_msg_id and repeats the same frame across timeouts and reconnects
// until the server acknowledges it, ctx ends, or the server refuses it with
// a non-retryable *Error; the server stores it at most once.
func (c *Client) Send(ctx context.Context, convID uint64, body string) (Ack, error) {
	return c.SendWithID(ctx, convID, NewClientMsgID(), body)
}

// SendWithID is Send with a caller-chosen client_msg_id (1–64 bytes); a
// second call with the same id returns the first message's Ack with
// Duplicate set.
func (c *Client) SendWithID(ctx context.Context, convID uint64, clientMsgID, body string) (Ack, error) {
	return c.write(ctx, protocol.Frame{Type: protocol.TypeSend, ConvID: convID, ClientMsgID: clientMsgID, Kind: protocol.KindText, Body: body})
}

// Edit replaces the body of message targetSeq; the edit is an event with its
// own seq. Retried like Send.
func (c *Client) Edit(ctx context.Context, convID, targetSeq uint64, body string) (Ack, error) {
	return c.write(ctx, protocol.Frame{Type: protocol.TypeEdit, ConvID: convID, ClientMsgID: NewClientMsgID(), TargetSeq: targetSeq, Body: body})
}

// Recall withdraws message targetSeq; the recall is an event with its own
// seq. Retried like Send.
func (c *Client) Recall(ctx context.Context, convID, targetSeq uint64) (Ack, error) {
	return c.write(ctx, protocol.Frame{Type: protocol.TypeRecall, ConvID: convID, ClientMsgID: NewClientMsgID(), TargetSeq: targetSeq})
}

// React adds emoji (one of the server's chat.reactions) to the user's
// reactions to message targetSeq; the reaction is an event with its own
// seq. Retried like Send. In an end-to-end encrypted conversation the
// server refuses it (e2e_unsupported): it must not learn who reacted how.
func (c *Client) React(ctx context.Context, convID, targetSeq uint64, emoji string) (Ack, error) {
	return c.write(ctx, protocol.Frame{Type: protocol.TypeReact, ConvID: convID, ClientMsgID: NewClientMsgID(), TargetSeq: targetSeq, Emoji: emoji})
}

// Unreact takes emoji back from the user's reactions to message
// targetSeq (an event with its own seq, like React).
func (c *Client) Unreact(ctx context.Context, convID, targetSeq uint64, emoji string) (Ack, error) {
	return c.write(ctx, protocol.Frame{Type: protocol.TypeReact, ConvID: convID, ClientMsgID: NewClientMsgID(), TargetSeq: targetSeq, Emoji: emoji, Remove: true})
}

func (c *Client) write(ctx context.Context, f protocol.Frame) (Ack, error) {
	if f.ClientMsgID == "" {
		return Ack{}, &Error{Code: protocol.CodeInvalidArgument, Msg: "client_msg_id is required"}
	}
	r, _, err := c.do(ctx, f, protocol.TypeAck, idempotent)
	if err != nil {
		return Ack{}, err
	}
	return Ack{ConvID: r.ConvID, ClientMsgID: r.ClientMsgID, Seq: r.Seq, MsgID: r.MsgID, ServerTime: r.ServerTime, Duplicate: r.Duplicate}, nil
}

// MarkRead raises the user's read position in convID to seq (on every
// device of the user, unless the server keeps read positions per device).
func (c *Client) MarkRead(ctx context.Context, convID, seq uint64) error {
	_, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeRead, ConvID: convID, Seq: seq}, protocol.TypeOK, idempotent)
	return err
}

// Conversations returns the user's conversation list with unread counts.
func (c *Client) Conversations(ctx context.Context) ([]protocol.ConvSummary, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeConvList}, protocol.TypeConvList, idempotent)
	if err != nil {
		return nil, err
	}
	return r.List, nil
}

// History returns one page of convID in ascending seq and whether more
// exist in the direction asked (forward: newer; backward: older).
// It does not touch the event stream.
func (c *Client) History(ctx context.Context, convID uint64, q HistoryQuery) ([]protocol.Message, bool, error) {
	f := protocol.Frame{Type: protocol.TypeHistory, ConvID: convID, BeforeSeq: q.BeforeSeq, Limit: q.Limit}
	if q.Forward || q.AfterSeq != 0 {
		after := q.AfterSeq
		f.AfterSeq = &after
	}
	r, _, err := c.do(ctx, f, protocol.TypeHistory, idempotent)
	if err != nil {
		return nil, false, err
	}
	return r.Messages, r.HasMore, nil
}

// OpenDirect returns the direct conversation with peer, creating it the
// first time (the server answers with the same conversation every time).
func (c *Client) OpenDirect(ctx context.Context, peer string) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeOpenDirect, Peer: peer}, idempotent)
}

// CreateGroup creates a group with the caller and members. It is not
// repeated after a lost connection or a timeout, since that could create a
// second group: those come back as ErrDisconnected / ErrTimeout.
func (c *Client) CreateGroup(ctx context.Context, name string, members []string) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeCreateGroup, Name: name, Members: slices.Clone(members)}, once)
}

// AddMembers adds members to group convID; adding a member twice is
// harmless, so it is retried like Send.
func (c *Client) AddMembers(ctx context.Context, convID uint64, members []string) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeAddMembers, ConvID: convID, Members: slices.Clone(members)}, idempotent)
}

func (c *Client) conv(ctx context.Context, f protocol.Frame, policy retryPolicy) (protocol.ConvInfo, error) {
	r, _, err := c.do(ctx, f, protocol.TypeConv, policy)
	if err != nil {
		return protocol.ConvInfo{}, err
	}
	if r.Conv == nil {
		return protocol.ConvInfo{}, fmt.Errorf("%s: answer has no conversation", f.Type)
	}
	return *r.Conv, nil
}

// Sync asks the server again for everything after this device's positions
// (all:true) and hands the snapshot to the event stream. It returns once the
// snapshot is queued for the application, not when the application has read
// it, so it is safe to call from the goroutine that reads Events.
func (c *Client) Sync(ctx context.Context) error {
	max := protocol.DefaultLimits.MaxSyncConvs
	if h, ok := c.Hello(); ok && h.Limits.MaxSyncConvs > 0 {
		max = h.Limits.MaxSyncConvs
	}
	for _, f := range syncFrames(c.positions(), max) {
		r, cn, err := c.do(ctx, f, protocol.TypeSnapshot, idempotent)
		if err != nil {
			return err
		}
		snap := r.Snapshot
		// If cn has ended meanwhile the post is never run: the next
		// connection's own sync covers the same ground.
		cn.disp.post(func() { cn.disp.applySnapshot(snap) })
	}
	return nil
}

// syncFrames builds the sync requests for pos: all:true on the first, every
// known position spread over requests of at most max conversations.
func syncFrames(pos map[uint64]uint64, max int) []protocol.Frame {
	ids := make([]uint64, 0, len(pos))
	for id := range pos {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	frames := []protocol.Frame{{Type: protocol.TypeSync, All: true}}
	for len(ids) > 0 {
		n := min(len(ids), max)
		f := &frames[len(frames)-1]
		if len(f.Convs) > 0 {
			frames = append(frames, protocol.Frame{Type: protocol.TypeSync})
			f = &frames[len(frames)-1]
		}
		for _, id := range ids[:n] {
			f.Convs = append(f.Convs, protocol.SyncConv{ConvID: id, AfterSeq: pos[id]})
		}
		ids = ids[n:]
	}
	return frames
}

// ReadBy returns the read receipts of message seq of convID: how many of
// the members who can see it have read it and, in a group small enough
// (the server's chat.read_by_names), who. A group over
// chat.read_by_max_members answers too_large.
func (c *Client) ReadBy(ctx context.Context, convID, seq uint64) (protocol.ReadBy, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeReadBy, ConvID: convID, Seq: seq}, protocol.TypeReadBy, idempotent)
	if err != nil {
		return protocol.ReadBy{}, err
	}
	if r.ReadBy == nil {
		return protocol.ReadBy{}, fmt.Errorf("read_by: answer has no receipts")
	}
	return *r.ReadBy, nil
}
