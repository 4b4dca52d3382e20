// Package store defines Parley's durable state: conversations, memberships
// with join_seq, messages keyed the way a wide-column store keys them
// (partition (conv_id, time bucket), clustering msg_id descending, plus a
// dense seq index), per-user conversation rows, read and delivered positions
// and idempotency records.
//
// Store is the engine seam. Each engine lives in its own package named after
// it (store/pebble, later store/cassandra) and passes the conformance suite in
// store/storetest. Implementations are safe for concurrent use.
package store

import (
	"context"
	"errors"
)

// Sentinel errors. Adapters wrap engine failures as "<engine>: op: %w".
var (
	ErrNotFound  = errors.New("store: not found")
	ErrNotMember = errors.New("store: not a member")
	ErrExists    = errors.New("store: already exists")
	ErrConflict  = errors.New("store: conflict")
	ErrClosed    = errors.New("store: closed")
)

// ConvKind tells a 1:1 conversation from a group. Both are channels with
// members; only creation and naming differ.
type ConvKind uint8

const (
	Direct ConvKind = 1
	Group  ConvKind = 2
)

func (k ConvKind) String() string {
	switch k {
	case Direct:
		return "direct"
	case Group:
		return "group"
	}
	return "unknown"
}

// Role of a member in a conversation.
type Role uint8

const (
	RoleMember Role = 0
	RoleAdmin  Role = 1
	RoleOwner  Role = 2
)

// Conversation is a channel's own row.
type Conversation struct {
	ID        uint64
	Kind      ConvKind
	Name      string
	CreatedAt int64 // unix ms
	LastSeq   uint64
	Members   int
}

// Member is one user's membership of a conversation. Messages with
// seq < JoinSeq are never shown to the member.
type Member struct {
	ConvID  uint64
	UserID  string
	Role    Role
	JoinSeq uint64
}

// ConvRow is a user's row for one conversation: what the conversation list
// reads. LastSeq is the conversation's last seq as materialised for this user
// by write fan-out.
type ConvRow struct {
	ConvID  uint64
	UserID  string
	Kind    ConvKind
	JoinSeq uint64
	LastSeq uint64
}

// Message is a stored message or event. The body is stored once.
type Message struct {
	ConvID       uint64
	Seq          uint64
	MsgID        uint64
	Sender       string
	SenderDevice string
	ClientMsgID  string
	Kind         string
	Body         string
	TargetSeq    uint64
	ServerTime   int64 // unix ms
	Edited       bool
	Recalled     bool
}

// Append is one message to persist. The store assigns Seq (the conversation's
// last seq + 1, dense and never reused) atomically with the write.
type Append struct {
	// Msg.Seq is ignored; MsgID (non-zero, unique in the conversation,
	// else ErrConflict) and ServerTime are the caller's.
	Msg Message
	// Rows lists users whose conversation row gets LastSeq = the new seq in
	// the same durable write (write fan-out). Empty means no row writes.
	Rows []string
	// Check is called under the conversation's lock with the target message
	// when Msg.TargetSeq != 0 (edit, recall); it returns an error to refuse,
	// or nil and the target as it must be stored afterwards.
	Check func(target Message) (Message, error)
}

// AppendResult is the stored message. Duplicate is true when the
// (conv, sender, client_msg_id) was already stored: nothing new was written
// and Msg is the original.
type AppendResult struct {
	Msg       Message
	Duplicate bool
}

// Store is the durable state of Parley.
type Store interface {
	// CreateConversation stores a new conversation with its first members,
	// all with JoinSeq 1. It fails with ErrExists if the id is taken.
	CreateConversation(ctx context.Context, c Conversation, members []Member) error
	// Direct returns the 1:1 conversation of users a and b, creating it with
	// id newID (and both as members) when it does not exist yet.
	Direct(ctx context.Context, a, b string, newID uint64, now int64) (Conversation, error)
	// Conversation returns a conversation's row, ErrNotFound if none.
	Conversation(ctx context.Context, id uint64) (Conversation, error)
	// Member returns a membership, ErrNotMember if the user is not a member.
	Member(ctx context.Context, convID uint64, user string) (Member, error)
	// Members lists every member of a conversation.
	Members(ctx context.Context, convID uint64) ([]Member, error)
	// AddMembers adds users with JoinSeq = the conversation's last seq + 1
	// (decided under the same lock as seq allocation) and returns the new
	// memberships; users already members are returned unchanged.
	AddMembers(ctx context.Context, convID uint64, users []string, role Role) ([]Member, error)

	// Append durably stores a message, assigning its seq. It returns only
	// after the write is on stable storage; an error means nothing was
	// stored. A retry with the same (conv, sender, client_msg_id) returns
	// the original with Duplicate set, also after a restart.
	Append(ctx context.Context, a Append) (AppendResult, error)
	// Messages returns messages with from ≤ seq ≤ to in ascending seq order,
	// at most limit of them (the lowest seqs first).
	Messages(ctx context.Context, convID, from, to uint64, limit int) ([]Message, error)
	// Latest returns up to n messages with seq < before (0: no bound) and
	// seq ≥ floor, the highest ones, in ascending seq order.
	Latest(ctx context.Context, convID uint64, before, floor uint64, n int) ([]Message, error)

	// UserConversations lists the conversation rows of a user.
	UserConversations(ctx context.Context, user string) ([]ConvRow, error)
	// SetRead raises the read position of (user, device, conv) to seq and
	// returns the position after the call; device "" is the per-user
	// position. It never lowers a position.
	SetRead(ctx context.Context, user, device string, convID, seq uint64) (uint64, error)
	// Read returns the read position of (user, device, conv), 0 if none.
	Read(ctx context.Context, user, device string, convID uint64) (uint64, error)
	// SetDelivered raises the delivered position of (user, conv).
	SetDelivered(ctx context.Context, user string, convID, seq uint64) (uint64, error)
	// Delivered returns the delivered position of (user, conv).
	Delivered(ctx context.Context, user string, convID uint64) (uint64, error)

	// Close releases the store. It is safe to call twice.
	Close() error
}
