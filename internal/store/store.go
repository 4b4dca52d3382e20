// Package store defines Parley's durable state: conversations, memberships
// with join_seq, messages keyed the way a wide-column store keys them
// (partition (conv_id, time bucket), clustering msg_id descending, plus a
// dense seq index), per-user conversation rows, read and delivered positions
// and idempotency records.
//
// Store is the engine seam. Each engine lives in its own package named after
// it (store/pebble, store/cassandra), passes the conformance suite in
// store/storetest, and is handed out behind Check (seam.go): the one place
// that admits calls (context, Close, a broken engine) and checks their
// arguments, so an engine's methods trust theirs. Stores are safe for
// concurrent use; Close waits for the calls in progress.
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
	// ErrNotOwner: in cluster mode, this process does not own the
	// conversation's partition (or lost it during the write, which was then
	// not acknowledged); the caller retries, on the owner.
	ErrNotOwner = errors.New("store: not the conversation's owner")
)

// DirectKey is the routing key of the pair a, b's direct conversation
// (e2e: its end-to-end encrypted one): in cluster mode the owner of the
// partition this key maps to (lease.Partition, as a conversation id maps)
// opens and creates the pair's conversation, so one process at a time
// decides it. The same for (a, b) and (b, a); the same in every process
// and release (FNV-1a over the sorted pair and the flag).
func DirectKey(a, b string, e2e bool) uint64 {
	if b < a {
		a, b = b, a
	}
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= prime
		}
		h ^= 0xff // a separator no id byte equals (ids are printable)
		h *= prime
	}
	add(a)
	add(b)
	if e2e {
		add("e2e")
	}
	return h
}

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
	Members   int // current members (LeaveSeq 0)
	// Tier is the group's fan-out tier as last decided by the chat service
	// (0 until first set); stored so that hysteresis survives restarts.
	Tier uint8
	// E2E is set at creation and never changes: the conversation carries
	// only end-to-end encrypted bodies.
	E2E bool
	// EveryoneSeq is the highest seq of a message with MentionAll (0:
	// none), set by Append with the message: a member was mentioned by
	// @everyone since its read position when EveryoneSeq is above it.
	EveryoneSeq uint64
}

// Member is one user's membership of a conversation. Messages with
// seq < JoinSeq are never shown to the member, nor, once LeaveSeq is set,
// those with seq > LeaveSeq.
type Member struct {
	ConvID   uint64
	UserID   string
	Role     Role
	JoinSeq  uint64
	LeaveSeq uint64 // 0: a current member
	Muted    bool   // may read but not send
}

// ConvRow is a user's row for one conversation: what the conversation list
// reads. LastSeq is the conversation's last seq as materialised for this user
// by write fan-out.
type ConvRow struct {
	ConvID   uint64
	UserID   string
	Kind     ConvKind
	JoinSeq  uint64
	LeaveSeq uint64 // 0: a current member
	LastSeq  uint64
	// MentionSeq is the highest seq that mentioned this user (an
	// @everyone included), as materialised by UpdateRows.
	MentionSeq uint64
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
	Mentions     []string // users mentioned
	MentionAll   bool     // @everyone
	// CoalesceKey makes the message a state update: only the latest
	// message of a conversation with a given key carries its body on reads.
	CoalesceKey string
	// Superseded is set on reads (never stored) when a later message of
	// the conversation has the same CoalesceKey; its Body is then empty.
	Superseded bool
	// Attachment is the attachment record a kind "file" message names (0:
	// none, and once recalled).
	Attachment uint64
	// ReplyTo is the seq of the earlier message of the conversation this
	// one answers (0: none). Like the identity it is set by Append and
	// kept by every rewrite (edits, recalls).
	ReplyTo uint64
	// Reactions are the counts of the reactions to the message, in the
	// order their emojis were first added (react.go); kept by every
	// rewrite but a recall, which clears them.
	Reactions []Reaction
}

// Append is one message to persist. The store assigns Seq (the conversation's
// last seq + 1, dense and never reused) atomically with the write.
type Append struct {
	// Msg.Seq is ignored; MsgID (non-zero, unique in the conversation,
	// else ErrConflict) and ServerTime are the caller's.
	Msg Message
	// Check is called under the conversation's lock with the target message
	// when Msg.TargetSeq != 0 (edit, recall); it returns an error to refuse,
	// or nil and the target as it must be stored afterwards.
	Check func(target Message) (Message, error)
	// Rows asks for write fan-out with the message: the conversation rows
	// of every current member are raised to the new seq (MentionSeq too
	// for the users in Msg.Mentions, or all of them with MentionAll).
	// AppendResult.RowsWritten reports whether that happened; an engine
	// that cannot write them in the message's atomic write writes them
	// right after it and reports a failure there as RowsWritten false
	// (the message is stored all the same, and the caller's fan-out
	// writes the rows).
	Rows bool
	// ReadBy, if set, asks for the read position of (ReadBy.User,
	// ReadBy.Device) in the conversation to be raised to the new seq with
	// the message (the sender has seen what it sent); a position already
	// beyond it is kept. Every engine honours it: over the network
	// alongside the message's own last writes, instead of one more round
	// trip after them; embedded once the message is durable.
	// AppendResult.ReadRaised reports that it was done: never on a
	// duplicate, and not when the position's write failed (the message is
	// stored all the same and the caller raises the position).
	ReadBy *Reader
	// React makes the append a reaction (react.go): with Msg.TargetSeq
	// set, the engine applies it to the target's counts and the sender's
	// own set under the conversation's lock, after Check accepted the
	// target, and stores both with the event. A reaction that changes
	// nothing fails with ErrConflict and stores nothing.
	React *React
}

// Reader names a read position: a user's device ("" for the per-user
// position).
type Reader struct {
	User, Device string
}

// AppendResult is the stored message. Duplicate is true when the
// (conv, sender, client_msg_id) was already stored: nothing new was written
// and Msg is the original.
type AppendResult struct {
	Msg         Message
	Duplicate   bool
	RowsWritten bool // Append.Rows was honoured (never on a duplicate)
	ReadRaised  bool // Append.ReadBy was honoured (never on a duplicate)
}

// Pending is one stored message whose fan-out is not yet recorded done:
// an outbox entry.
type Pending struct {
	ConvID uint64
	Seq    uint64
}

// Delivered is a delivered position to raise (Store.SetDelivered, or
// in bulk where a store offers it: DeliveredRaiser).
type Delivered struct {
	User   string
	ConvID uint64
	Seq    uint64
}

// DeliveredRaiser is implemented by stores that raise many delivered
// positions for less than a SetDelivered each (Cassandra: group-committed
// writes, no read-back). An error means some may not be raised; raising
// again is harmless (positions are max-registers).
type DeliveredRaiser interface {
	RaiseDelivered(ctx context.Context, ps []Delivered) error
}

// Store is the durable state of Parley.
//
// Arguments: user and device ids are protocol.ValidID ids (device "" is
// the per-user read position, and Message.SenderDevice may be empty);
// roles are at most RoleOwner, kinds Direct or Group, and Append's
// Msg.MsgID is not 0. For an invalid one (Check decides it for every
// engine), a call that would store it fails with an error that is none of
// the sentinels, except that RemoveMembers and UpdateRows skip invalid ids
// and Append ignores an invalid ReadBy; a call that looks it up finds
// nothing: ErrNotMember from Member, SetRole and SetMuted, ErrNotFound from
// TakeBundle, 0 from Read, Delivered and PreKeyCounts, no rows from
// UserConversations and KeyDevices, and RemoveDevice removes nothing.
// Attachment records are checked as attach.go says (bounded strings, known
// states, no change of what never changes).
type Store interface {
	// CreateConversation stores a new conversation with its first members,
	// all with JoinSeq 1. It fails with ErrExists if the id is taken.
	CreateConversation(ctx context.Context, c Conversation, members []Member) error
	// Direct returns the 1:1 conversation of users a and b, creating it with
	// id newID (and both as members) when it does not exist yet. In cluster
	// mode only the owner of DirectKey(a, b, false)'s partition may run it
	// (ErrNotOwner elsewhere).
	Direct(ctx context.Context, a, b string, newID uint64, now int64) (Conversation, error)
	// Conversation returns a conversation's row, ErrNotFound if none.
	Conversation(ctx context.Context, id uint64) (Conversation, error)
	// Member returns a membership, former ones included (LeaveSeq set);
	// ErrNotMember if the user never was a member.
	Member(ctx context.Context, convID uint64, user string) (Member, error)
	// Members lists the current members of a conversation (LeaveSeq 0).
	Members(ctx context.Context, convID uint64) ([]Member, error)
	// AddMembers adds users with JoinSeq = the conversation's last seq + 1
	// (decided under the same lock as seq allocation) and returns the new
	// memberships; users already members are returned unchanged. A former
	// member rejoins: new JoinSeq, LeaveSeq 0 (earlier history stays hidden).
	// New members get a conversation row with LastSeq = the last seq.
	AddMembers(ctx context.Context, convID uint64, users []string, role Role) ([]Member, error)
	// RemoveMembers sets LeaveSeq = the conversation's last seq (under the
	// seq lock) for the users that are current members and returns their
	// memberships; others are ignored. Their rows keep LeaveSeq too.
	RemoveMembers(ctx context.Context, convID uint64, users []string) ([]Member, error)
	// SetRole and SetMuted change a current member; ErrNotMember otherwise.
	SetRole(ctx context.Context, convID uint64, user string, role Role) error
	SetMuted(ctx context.Context, convID uint64, user string, muted bool) error
	// SetTier records the conversation's fan-out tier.
	SetTier(ctx context.Context, convID uint64, tier uint8) error

	// Append durably stores a message, assigning its seq. It returns only
	// after the write is on stable storage; an error means nothing was
	// stored. A retry with the same (conv, sender, client_msg_id) returns
	// the original with Duplicate set, also after a restart.
	//
	// The outbox: a stored message also has an outbox entry, written
	// durably before Append returns (in the message's atomic write where
	// the engine has one), so its fan-out survives the process: Pending
	// lists it until FanoutDone clears it. A duplicate returns only once
	// its original's entry was written (it may write it again).
	Append(ctx context.Context, a Append) (AppendResult, error)
	// Pending lists up to limit outbox entries of durable messages, in
	// (conversation, seq) order within each engine partition.
	Pending(ctx context.Context, limit int) ([]Pending, error)
	// FanoutDone clears the outbox entries of seqs: their fan-out is done
	// (or handed to the compensation ledger). Clearing an entry that is
	// not there is no error. It need not be synced: an entry that comes
	// back after a crash only repeats idempotent fan-out.
	FanoutDone(ctx context.Context, convID uint64, seqs []uint64) error

	// Messages returns messages with from ≤ seq ≤ to in ascending seq order,
	// at most limit of them (the lowest seqs first).
	Messages(ctx context.Context, convID, from, to uint64, limit int) ([]Message, error)
	// Latest returns up to n messages with seq < before (0: no bound) and
	// seq ≥ floor, the highest ones, in ascending seq order.
	Latest(ctx context.Context, convID uint64, before, floor uint64, n int) ([]Message, error)
	// AsOf turns msgs, messages of convID as Messages or Latest returned
	// them, into what they were at seq asOf (a former member's leave_seq):
	// a message edited by events with seqs above asOf gets back the Body
	// and Edited it had after its last edit at or below asOf (none: as
	// appended). A recalled message stays recalled whatever the recall's
	// seq: a recall deletes every earlier body. Messages above asOf and
	// the other fields are left as they are. Only edits whose Check
	// rewrote the target count.
	AsOf(ctx context.Context, convID, asOf uint64, msgs []Message) error

	// UpdateRows is write fan-out: for each user that is a current member,
	// raise its conversation row's LastSeq to seq and, with mention, its
	// MentionSeq. It is idempotent (max semantics), so a compensation task
	// may repeat it. Users whose membership does not hold seq are skipped:
	// those never members, and former members for seqs above their
	// leave_seq (a former member's row still takes the seqs it could see,
	// since fan-out may run after the leave).
	UpdateRows(ctx context.Context, convID, seq uint64, users []string, mention bool) error
	// UserConversations lists the conversation rows of a user, former
	// memberships included (LeaveSeq set).
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

	// E2E is the key directory and the E2E direct conversations (keys.go).
	E2E
	// KT is the key transparency log's leaves and keys (kt.go).
	KT
	// Attachments is the attachment records and their owners' usage
	// (attach.go).
	Attachments
	// Push is the devices' push registrations (push.go).
	Push
	// Notify is the users' notification preferences: conversation mutes
	// and do-not-disturb (notify.go).
	Notify
	// Reactions is each user's reactions to messages (react.go).
	Reactions

	// Close releases the store. It is safe to call twice.
	Close() error
}
