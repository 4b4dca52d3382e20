package client

import (
	"context"
	"slices"

	"github.com/parley-im/parley/protocol"
)

// Presence, typing and the small requests (docs/protocol.md, "Presence
// and typing").

// WatchPresence sets the users this client watches (presence_sub: at most
// max_presence_subs, each sharing a conversation with the caller, else
// not_member; an empty list stops watching) and returns their current
// states. Later changes arrive as EventPresence. The watch list belongs to
// the connection on the server, so the client sends it again after every
// reconnect and hands the answer over as an EventPresence too.
func (c *Client) WatchPresence(ctx context.Context, users []string) ([]protocol.PresenceState, error) {
	users = slices.Clone(users)
	if users == nil {
		users = []string{}
	}
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypePresenceSub, Users: users}, protocol.TypePresence, idempotent)
	if err != nil {
		return nil, err
	}
	c.watch.Lock()
	c.watch.users = users
	c.watch.Unlock()
	return r.States, nil
}

// watched returns the presence watch list to send again on a new
// connection.
func (c *Client) watched() []string {
	c.watch.Lock()
	defer c.watch.Unlock()
	return c.watch.users
}

// Typing tells the other members of convID that this user is typing (sent
// on to their connected devices as EventTyping; direct conversations and
// small groups only). The server drops notices closer than 2 s apart per
// user and conversation, so calling it on every keystroke is fine.
func (c *Client) Typing(ctx context.Context, convID uint64) error {
	_, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeTyping, ConvID: convID}, protocol.TypeOK, idempotent)
	return err
}

// Ping asks the server for its time (pong) and returns it in Unix
// milliseconds. The client pings on its own to keep the connection alive;
// this is for measuring a round trip or the clock offset.
func (c *Client) Ping(ctx context.Context) (int64, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypePing}, protocol.TypePong, idempotent)
	if err != nil {
		return 0, err
	}
	return r.ServerTime, nil
}

// RemoveKeys drops this device's end-to-end encryption keys from the
// server's key directory (keys_remove); the device's E2E contacts get a
// device_removed event.
func (c *Client) RemoveKeys(ctx context.Context) error {
	_, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKeysRemove}, protocol.TypeKeys, idempotent)
	return err
}

// SendOptions are the optional parts of a message (SendWith).
type SendOptions struct {
	// ClientMsgID is the message's idempotency key (1–64 bytes); "" picks
	// a fresh one. Repeating a send with the same id stores nothing new and
	// returns the first Ack with Duplicate set.
	ClientMsgID string
	// Mentions are users the message mentions (at most max_mentions): their
	// conversation summary shows Mentioned until they read past it.
	Mentions []string
	// MentionAll is @everyone (groups only; once per group per minute by
	// default, else rate_limited).
	MentionAll bool
	// CoalesceKey (1–64 bytes) makes the message a state message (kind
	// "state"): reads show only this sender's latest message of the key
	// in full, older ones as superseded.
	CoalesceKey string
	// ReplyTo is the seq of an earlier message of the conversation this
	// one answers (not with CoalesceKey). One the sender may not see —
	// not stored yet, before it joined, an event — is refused with
	// bad_reference; a recalled one with conflict.
	ReplyTo uint64
}

// SendWith stores body in convID with mentions, as a reply or as a state
// message; retried like Send. End-to-end encrypted conversations refuse mentions
// with e2e_unsupported.
func (c *Client) SendWith(ctx context.Context, convID uint64, body string, o SendOptions) (Ack, error) {
	f := protocol.Frame{Type: protocol.TypeSend, ConvID: convID, ClientMsgID: o.ClientMsgID, Kind: protocol.KindText, Body: body,
		Mentions: slices.Clone(o.Mentions), MentionAll: o.MentionAll, CoalesceKey: o.CoalesceKey, ReplyTo: o.ReplyTo}
	if f.ClientMsgID == "" {
		f.ClientMsgID = NewClientMsgID()
	}
	if o.CoalesceKey != "" {
		f.Kind = protocol.KindState
	}
	return c.write(ctx, f)
}

// SendState stores body as the newest state of key in convID (a
// coalescible update: a counter, a red packet's remaining amount). Each
// takes a seq; sync and history show the sender's older states of the
// same key as superseded, without body. Retried like Send.
func (c *Client) SendState(ctx context.Context, convID uint64, key, body string) (Ack, error) {
	if key == "" {
		return Ack{}, &Error{Code: protocol.CodeInvalidArgument, Msg: "a state message needs a coalesce key"}
	}
	return c.SendWith(ctx, convID, body, SendOptions{CoalesceKey: key})
}
