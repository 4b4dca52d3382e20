package client

import (
	"time"

	"github.com/parley-im/parley/protocol"
)

// EventKind tells what an Event carries.
type EventKind int

// Event kinds.
const (
	// EventMessage: Message is the next message (text, edit, recall or system
	// event) of its conversation, in seq order.
	EventMessage EventKind = iota + 1
	// EventReceipt: Receipt is a delivered/read receipt pushed by the server.
	EventReceipt
	// EventSnapshot: Snapshot describes a conversation the (re)connect sync
	// (or Sync) returned, before its messages arrive as EventMessage. Skipped > 0
	// when the conversation was too far behind and that many older messages
	// were jumped over; they can be paged with History(BeforeSeq).
	// A conversation the sync did not return (nothing new in it then) and
	// first seen through a push gets one too, without messages, when the
	// conversation list gives its starting point: Snapshot.FromSeq is the
	// seq after which its EventMessages follow (the read position, or
	// just before the first message pushed if that is lower; the read
	// position includes the user's own sends, see docs/protocol.md). A
	// conversation missing from the list (the user just left it, or the
	// list lags the push) gets its pushed messages without one.
	EventSnapshot
	// EventConnected: a connection is up and its (re)connect sync has been
	// applied: the snapshot's EventSnapshot/EventMessage events came just
	// before it, and what follows arrives as pushes. Hello is the server's
	// hello.
	EventConnected
	// EventDisconnected: the connection ended; Err says why, nil when the
	// client itself closed it (Close, or Run's context). After a goaway the
	// client leaves on its own and Err says it is moving to the next
	// gateway. The client reconnects unless Run is returning.
	EventDisconnected
	// EventKeysLow: the server handed out one-time prekeys of this user's
	// device KeysLow.DeviceID and few are left; that device uploads more
	// (e2eechat.Messenger.PublishKeys).
	EventKeysLow
	// EventPresence: Presence holds the new state of users this client
	// watches (WatchPresence): pushed when they change, and the current
	// states again after every reconnect.
	EventPresence
	// EventTyping: Typing says a member of ConvID is typing (never stored;
	// at most one per user and conversation per 2 s).
	EventTyping
	// EventReconnecting: no connection is up and the client tries URL
	// again after Delay; Err says why the last attempt failed or the last
	// connection ended. Sent after every failed attempt (so an unreachable
	// server is visible at once) and before each reconnect; it is dropped
	// rather than waited for when Events is full.
	EventReconnecting
	// EventMute: this user muted ConvID's notifications until MuteUntil
	// (protocol.MuteForever: until unmuted), or unmuted them (MuteUntil
	// 0), on any of its devices.
	EventMute
	// EventDND: this user's do-not-disturb is now DND (set on any of its
	// devices).
	EventDND
)

func (k EventKind) String() string {
	switch k {
	case EventMessage:
		return "message"
	case EventReceipt:
		return "receipt"
	case EventSnapshot:
		return "snapshot"
	case EventConnected:
		return "connected"
	case EventDisconnected:
		return "disconnected"
	case EventKeysLow:
		return "keys_low"
	case EventPresence:
		return "presence"
	case EventTyping:
		return "typing"
	case EventReconnecting:
		return "reconnecting"
	case EventMute:
		return "mute"
	case EventDND:
		return "dnd"
	}
	return "unknown"
}

// Event is one item of the Events stream. Only the fields of its Kind are set.
type Event struct {
	Kind     EventKind
	ConvID   uint64
	Message  *protocol.Message
	Receipt  *Receipt
	Snapshot *protocol.ConvSnapshot // Messages is nil: they follow as EventMessage
	Skipped  uint64
	Hello    *protocol.Hello
	Err      error
	KeysLow  *KeysLow
	Presence []protocol.PresenceState
	Typing   *Typing
	// MuteUntil and DND: EventMute's and EventDND's.
	MuteUntil int64
	DND       *protocol.DND
	// URL and Delay: EventReconnecting's next attempt.
	URL   string
	Delay time.Duration
}

// Typing is a typing notice: UserID is typing in ConvID.
type Typing struct {
	ConvID uint64
	UserID string
}

// KeysLow says how many one-time prekeys a device of this user has left.
type KeysLow struct {
	DeviceID   string
	PreKeys    int
	KEMPreKeys int
}

// Receipt is a pushed delivered/read receipt: UserID's device DeviceID has
// every message of ConvID up to Seq (State protocol.StateDelivered or
// protocol.StateRead).
type Receipt struct {
	ConvID   uint64
	UserID   string
	DeviceID string
	Seq      uint64
	State    string
}

// Ack is the server's "stored" answer to Send, Edit and Recall.
type Ack struct {
	ConvID      uint64
	ClientMsgID string
	Seq         uint64
	MsgID       uint64
	ServerTime  int64
	// Duplicate is true when an earlier attempt with the same client_msg_id
	// had already been stored; nothing new was stored.
	Duplicate bool
}

// HistoryQuery selects a page of history: Forward (ascending from AfterSeq;
// AfterSeq 0 is the start of the conversation), or backward: the latest
// Limit before BeforeSeq (0: the newest). A non-zero AfterSeq implies
// Forward. Limit 0 means the server's default (50); at most 200.
type HistoryQuery struct {
	Forward   bool
	AfterSeq  uint64
	BeforeSeq uint64
	Limit     int
}
