package protocol

// Frame types sent by clients.
const (
	TypePing        = "ping"
	TypeSend        = "send"
	TypeEdit        = "edit"
	TypeRecall      = "recall"
	TypeDelivered   = "delivered"
	TypeRead        = "read"
	TypeSync        = "sync"
	TypeHistory     = "history"
	TypeConvList    = "conv_list"
	TypeOpenDirect  = "open_direct"
	TypeCreateGroup = "create_group"
	TypeAddMembers  = "add_members"
	TypeRemove      = "remove_members"
	TypeLeave       = "leave"
	TypeSetRole     = "set_role"
	TypeMute        = "mute"
	TypePresenceSub = "presence_sub"
	TypeTyping      = "typing"
	// TypeReadBy asks how many members have read a message (and, in a
	// small enough group, who); the answer is a frame of the same type.
	TypeReadBy = "read_by"
	// TypeReact adds (or, with remove, takes back) the sender's reaction
	// to a message: an event that takes a seq (reactions.go).
	TypeReact = "react"
)

// Frame types sent by the server. TypeHistory and TypeConvList answer the
// request of the same name.
const (
	TypeHello    = "hello"
	TypePong     = "pong"
	TypeAck      = "ack"
	TypeOK       = "ok"
	TypeError    = "error"
	TypeMsg      = "msg"
	TypeReceipt  = "receipt"
	TypeSnapshot = "snapshot"
	TypeConv     = "conv"
	TypeGoAway   = "goaway"
	TypePresence = "presence"
	// TypeReactions is a push of a medium or large group's reaction
	// events from_seq..seq, coalesced into the targets' counts.
	TypeReactions = "reactions"
)

// Message kinds. Edit and recall are events that take their own seq and name
// the message they change in target_seq.
const (
	KindText   = "text"
	KindEdit   = "edit"
	KindRecall = "recall"
	KindSystem = "system"
	// KindState is a coalescible state update (a red packet's remaining
	// amount, a flash sale's stock): only the latest message with the same
	// coalesce_key carries its body on reads, and intermediate pushes to a
	// lagging device may be dropped.
	KindState = "state"
	// KindReact and KindUnreact are reaction events (TypeReact): body is
	// the emoji, target_seq the message.
	KindReact   = "react"
	KindUnreact = "unreact"
)

// Roles of group members.
const (
	RoleMember = "member"
	RoleAdmin  = "admin"
	RoleOwner  = "owner"
)

// Receipt states.
const (
	StateDelivered = "delivered"
	StateRead      = "read"
)

// Conversation kinds.
const (
	ConvDirect = "direct"
	ConvGroup  = "group"
)

// Frame is every frame of the protocol in one flat JSON object: "type" says
// which fields apply (docs/protocol.md lists them per type). Absent fields are
// zero. IDs that may exceed 2^53 (conv_id, msg_id) travel as decimal strings
// so that JavaScript clients keep them exact.
type Frame struct {
	Type string `json:"type"`
	// RID is the client's request id, echoed on the one response to that
	// request (ack, ok, error, snapshot, history, conv_list, conv, pong).
	RID string `json:"rid,omitempty"`

	ConvID      uint64 `json:"conv_id,omitempty,string"`
	ClientMsgID string `json:"client_msg_id,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Body        string `json:"body,omitempty"`
	TargetSeq   uint64 `json:"target_seq,omitempty"`
	Seq         uint64 `json:"seq,omitempty"`

	// delivered: several cumulative positions in one frame (instead of
	// conv_id and seq)
	Positions []Position `json:"positions,omitempty"`

	// sync
	Convs []SyncConv `json:"convs,omitempty"`
	All   bool       `json:"all,omitempty"`

	// history: with after_seq present (0 included) the page runs forward
	// from it; without, backward from before_seq (absent or 0: the newest).
	BeforeSeq uint64  `json:"before_seq,omitempty"`
	AfterSeq  *uint64 `json:"after_seq,omitempty"`
	Limit     int     `json:"limit,omitempty"`

	// open_direct, create_group, add_members, remove_members, set_role, mute
	Peer    string   `json:"peer,omitempty"`
	Name    string   `json:"name,omitempty"`
	Members []string `json:"members,omitempty"`
	Role    string   `json:"role,omitempty"`
	Muted   bool     `json:"muted,omitempty"`

	// conv_mute (request and push): notifications of conv_id are muted
	// until this Unix millisecond (MuteForever: until unmuted); dnd_set
	// and dnd: the user's do-not-disturb (notify.go).
	MuteUntil int64 `json:"mute_until,omitempty"`
	DND       *DND  `json:"dnd,omitempty"`

	// send: mentions, @everyone, coalescible state
	Mentions    []string `json:"mentions,omitempty"`
	MentionAll  bool     `json:"mention_all,omitempty"`
	CoalesceKey string   `json:"coalesce_key,omitempty"`
	// ReplyTo (send) is the seq of an earlier message of the same
	// conversation this one answers.
	ReplyTo uint64 `json:"reply_to,omitempty"`

	// react: the emoji added to (remove: taken from) target_seq's
	// reactions; reactions (push): the targets' counts after the events
	// from_seq..seq.
	Emoji   string    `json:"emoji,omitempty"`
	Remove  bool      `json:"remove,omitempty"`
	FromSeq uint64    `json:"from_seq,omitempty"`
	Reacted []Reacted `json:"reacted,omitzero"`

	// presence_sub (users), presence (states)
	Users  []string        `json:"users,omitempty"`
	States []PresenceState `json:"states,omitzero"`

	// server → client
	MsgID      uint64   `json:"msg_id,omitempty,string"`
	ServerTime int64    `json:"server_time,omitempty"`
	Duplicate  bool     `json:"duplicate,omitempty"`
	Message    *Message `json:"message,omitempty"`
	// Ack is a msg push's acknowledgement policy (AckBatch, AckNone;
	// absent: acknowledge promptly).
	Ack        string         `json:"ack,omitempty"`
	Messages   []Message      `json:"messages,omitzero"`
	HasMore    bool           `json:"has_more,omitempty"`
	Snapshot   []ConvSnapshot `json:"snapshot,omitzero"`
	List       []ConvSummary  `json:"list,omitzero"`
	Conv       *ConvInfo      `json:"conv,omitempty"`
	ReadBy     *ReadBy        `json:"read_by,omitempty"`
	UserID     string         `json:"user_id,omitempty"`
	DeviceID   string         `json:"device_id,omitempty"`
	State      string         `json:"state,omitempty"`
	Code       Code           `json:"code,omitempty"`
	Error      string         `json:"error,omitempty"`
	RetryAfter int64          `json:"retry_after_ms,omitempty"`
	Hello      *Hello         `json:"hello,omitempty"`

	// End-to-end encryption (e2e.go): the conversation flag of open_direct
	// and create_group, the key directory's fields.
	E2E       bool            `json:"e2e,omitempty"`
	Keys      *KeyUpload      `json:"keys,omitempty"`
	Bundles   []KeyBundle     `json:"bundles,omitzero"`
	Devices   []DeviceKeyInfo `json:"devices,omitzero"`
	KeyCounts *KeyCounts      `json:"counts,omitempty"`

	// Attachments (attach.go): upload_create declares conv_id, size,
	// sha256, media_type and name; upload_status, upload_part (part) and
	// upload_complete name the attachment_id; send of kind file names it
	// too; attachment_url names the message (conv_id, seq) and asks for
	// the thumbnail with thumbnail. Answers: upload, attachment.
	AttachmentID uint64          `json:"attachment_id,omitempty,string"`
	Size         int64           `json:"size,omitempty"`
	SHA256       string          `json:"sha256,omitempty"`
	MediaType    string          `json:"media_type,omitempty"`
	Part         int             `json:"part,omitempty"`
	Thumbnail    bool            `json:"thumbnail,omitempty"`
	Upload       *UploadInfo     `json:"upload,omitempty"`
	Attachment   *AttachmentInfo `json:"attachment,omitempty"`

	// Key transparency (ktframes.go): the leaf range of kt_consistency
	// (from, to: log sizes) and kt_leaves (from: the first leaf index,
	// with limit), the kt object of bundles, devices, kt_proof and
	// kt_leaves answers, the log's keys.
	From   uint64   `json:"from,omitempty"`
	To     uint64   `json:"to,omitempty"`
	KT     *KTProof `json:"kt,omitempty"`
	KTKeys *KTKeys  `json:"kt_keys,omitempty"`

	// Push registrations (push.go): the registration push_register and
	// push_remove name, the device's registrations a push answer lists.
	Push          *PushRegistration  `json:"push,omitempty"`
	Registrations []PushRegistration `json:"registrations,omitzero"`

	// Search (search.go): the query of a search request, the result of its
	// answer.
	Query  *SearchQuery  `json:"query,omitempty"`
	Search *SearchResult `json:"search,omitempty"`
}

// FillLists makes the lists a response of f's type always carries non-nil,
// so they encode as [] rather than being left out: a snapshot, history,
// conv_list, presence or conv answer has the same shape on the WebSocket as
// over HTTP, empty or not (docs/protocol.md, "Empty lists"). The list fields
// are omitzero: a nil list is left out of frames that do not carry it, an
// empty non-nil one is written as [].
func (f *Frame) FillLists() {
	switch f.Type {
	case TypeSnapshot:
		if f.Snapshot == nil {
			f.Snapshot = []ConvSnapshot{}
		}
		for i := range f.Snapshot {
			if f.Snapshot[i].Messages == nil {
				f.Snapshot[i].Messages = []Message{}
			}
		}
	case TypeHistory:
		if f.Messages == nil {
			f.Messages = []Message{}
		}
	case TypeSearch:
		if f.Search == nil {
			f.Search = &SearchResult{}
		}
		if f.Search.Hits == nil {
			f.Search.Hits = []SearchHit{}
		}
		for i := range f.Search.Hits {
			if f.Search.Hits[i].Highlights == nil {
				f.Search.Hits[i].Highlights = [][2]int{}
			}
		}
	case TypeConvList:
		if f.List == nil {
			f.List = []ConvSummary{}
		}
	case TypePresence:
		if f.States == nil {
			f.States = []PresenceState{}
		}
	case TypeConv:
		if f.Conv != nil && f.Conv.Members == nil {
			f.Conv.Members = []string{}
		}
	case TypeBundles:
		if f.Bundles == nil {
			f.Bundles = []KeyBundle{}
		}
	case TypeDevices:
		if f.Devices == nil {
			f.Devices = []DeviceKeyInfo{}
		}
	case TypePush:
		if f.Registrations == nil {
			f.Registrations = []PushRegistration{}
		}
	case TypeDND:
		if f.DND == nil {
			f.DND = &DND{}
		}
	}
}

// Position is one entry of a delivered frame's positions: this device has
// every message of ConvID up to and including Seq.
type Position struct {
	ConvID uint64 `json:"conv_id,string"`
	Seq    uint64 `json:"seq"`
}

// Acknowledgement policies of a msg push (its ack field), set from the
// conversation's fan-out tier. Absent (direct conversations and small
// groups): the push is re-sent until a delivered covers it, and clients
// acknowledge within about 100 ms (delivered receipts are shown).
const (
	// AckBatch (medium groups): tracked and re-sent like the others, but
	// clients coalesce its acknowledgements per connection, across
	// conversations, into one delivered frame about once a second.
	AckBatch = "batch"
	// AckNone (large groups): not tracked, never re-sent, not to be
	// acknowledged; a device finds what it missed by seq (gap fill, sync).
	AckNone = "none"
)

// SyncConv is one entry of a sync request: the client has every message of
// ConvID up to and including AfterSeq.
type SyncConv struct {
	ConvID   uint64 `json:"conv_id,string"`
	AfterSeq uint64 `json:"after_seq"`
}

// Message is a stored message as clients see it. Edit and recall events are
// messages too (Kind edit/recall, TargetSeq set); the message they target is
// shown with Edited or Recalled set and, once recalled, an empty body.
type Message struct {
	ConvID       uint64   `json:"conv_id,string"`
	Seq          uint64   `json:"seq"`
	MsgID        uint64   `json:"msg_id,string"`
	Sender       string   `json:"sender"`
	SenderDevice string   `json:"sender_device,omitempty"`
	ClientMsgID  string   `json:"client_msg_id,omitempty"`
	Kind         string   `json:"kind"`
	Body         string   `json:"body,omitempty"`
	TargetSeq    uint64   `json:"target_seq,omitempty"`
	ServerTime   int64    `json:"server_time"`
	Edited       bool     `json:"edited,omitempty"`
	Recalled     bool     `json:"recalled,omitempty"`
	Mentions     []string `json:"mentions,omitempty"`
	MentionAll   bool     `json:"mention_all,omitempty"`
	CoalesceKey  string   `json:"coalesce_key,omitempty"`
	// Superseded marks a state message whose coalesce_key has a later
	// message; its body is left out.
	Superseded bool `json:"superseded,omitempty"`
	// AttachmentID is the file of a kind "file" message (0 once recalled).
	AttachmentID uint64 `json:"attachment_id,omitempty,string"`
	// ReplyTo is the seq of the message this one answers (kept through
	// edits); ReplyRecalled says, on reads (history, sync), that the
	// message it answers has since been recalled.
	ReplyTo       uint64 `json:"reply_to,omitempty"`
	ReplyRecalled bool   `json:"reply_recalled,omitempty"`
	// Reactions are a message's reaction counts (reads: with Me, the
	// reader's own); on a reaction event (push: its target's counts
	// after it; reads: only on the page's last event of each target, the
	// target's counts now).
	Reactions []Reaction `json:"reactions,omitempty"`
}

// Reaction is one emoji's count on a message; Me (reads) says the reader
// is one of them.
type Reaction struct {
	Emoji string `json:"emoji"`
	Count int    `json:"count"`
	Me    bool   `json:"me,omitempty"`
}

// Reacted is one message's reaction counts in a reactions push.
type Reacted struct {
	Seq       uint64     `json:"seq"`
	Reactions []Reaction `json:"reactions"`
}

// PresenceState is one user's presence.
type PresenceState struct {
	UserID   string `json:"user_id"`
	Online   bool   `json:"online"`
	LastSeen int64  `json:"last_seen,omitempty"` // unix ms of going offline
	// Typing in a conversation (typing pushes only).
	ConvID uint64 `json:"conv_id,omitempty,string"`
}

// SystemEvent is the body of a kind "system" message: a membership change,
// which takes a seq like any message.
type SystemEvent struct {
	Event string   `json:"event"` // member_added, member_removed, member_left, role_changed, muted, unmuted
	Actor string   `json:"actor"`
	Users []string `json:"users"`
	Role  string   `json:"role,omitempty"`
	// Device is the device of device_added, device_removed and
	// identity_changed (E2E conversations only).
	Device string `json:"device,omitempty"`
	// Admin marks an event made through the server API (the operator),
	// whose Actor is then the admin actor id, not a member.
	Admin bool `json:"admin,omitempty"`
	// Text is a notice's text (event "notice", server API only).
	Text string `json:"text,omitempty"`
}

// ConvSnapshot is one conversation in a snapshot (the answer to sync). A
// conversation with nothing new is left out. Messages holds either the whole
// range after the client's position (gap ≤ the range limit) or only the
// latest ones, with MoreUnread counting those left out before them.
type ConvSnapshot struct {
	ConvID     uint64    `json:"conv_id,string"`
	Kind       string    `json:"kind"`
	LastSeq    uint64    `json:"last_seq"`
	ReadSeq    uint64    `json:"read_seq"`
	JoinSeq    uint64    `json:"join_seq"`
	Unread     uint64    `json:"unread"`
	FromSeq    uint64    `json:"from_seq"`
	MoreUnread uint64    `json:"more_unread,omitempty"`
	Messages   []Message `json:"messages"`
}

// ConvSummary is one row of the conversation list.
type ConvSummary struct {
	ConvID  uint64 `json:"conv_id,string"`
	Kind    string `json:"kind"`
	Name    string `json:"name,omitempty"`
	Peer    string `json:"peer,omitempty"`
	LastSeq uint64 `json:"last_seq"`
	ReadSeq uint64 `json:"read_seq"`
	JoinSeq uint64 `json:"join_seq"`
	Unread  uint64 `json:"unread"`
	// Mentioned: a message at or after read_seq mentions the user.
	Mentioned bool `json:"mentioned,omitempty"`
	// LeaveSeq is set once the user is no longer a member; nothing after
	// it is shown.
	LeaveSeq    uint64   `json:"leave_seq,omitempty"`
	LastMessage *Message `json:"last_message,omitempty"`
	// PeerReadSeq and PeerDeliveredSeq (direct conversations): how far
	// the peer has read and received, as its read and delivered receipts
	// said, so a device that missed them shows the right state.
	PeerReadSeq      uint64 `json:"peer_read_seq,omitempty"`
	PeerDeliveredSeq uint64 `json:"peer_delivered_seq,omitempty"`
	E2E              bool   `json:"e2e,omitempty"`
	// MuteUntil: the user muted the conversation's notifications until
	// then (MuteForever: until unmuted); absent when not muted.
	MuteUntil int64 `json:"mute_until,omitempty"`
}

// ConvInfo describes a conversation (answer to open_direct, create_group and
// add_members).
type ConvInfo struct {
	ConvID  uint64   `json:"conv_id,string"`
	Kind    string   `json:"kind"`
	Name    string   `json:"name,omitempty"`
	Members []string `json:"members"` // current members, sorted (up to 1000; see member_count)
	// MemberCount is the number of current members.
	MemberCount int    `json:"member_count"`
	LastSeq     uint64 `json:"last_seq"`
	JoinSeq     uint64 `json:"join_seq"`
	Role        string `json:"role,omitempty"` // the caller's role
	Tier        string `json:"tier,omitempty"` // small, medium or large (groups)
	E2E         bool   `json:"e2e,omitempty"`  // end-to-end encrypted (fixed at creation)
	// MuteUntil: the caller muted the conversation's notifications until
	// then (MuteForever: until unmuted); absent when not muted.
	MuteUntil int64 `json:"mute_until,omitempty"`
}

// ReadBy is the answer to read_by: of the MemberCount current members who
// can see message Seq (joined at or before it, its sender left out),
// ReadCount have read it (their read position is at or past it). Users
// names them, sorted, when MemberCount is at most the server's
// chat.read_by_names.
type ReadBy struct {
	ConvID      uint64   `json:"conv_id,string"`
	Seq         uint64   `json:"seq"`
	ReadCount   int      `json:"read_count"`
	MemberCount int      `json:"member_count"`
	Users       []string `json:"users,omitempty"`
}

// Hello is the first frame on every connection.
type Hello struct {
	Protocol      int    `json:"protocol"`
	SessionID     string `json:"session_id"`
	UserID        string `json:"user_id"`
	DeviceID      string `json:"device_id"`
	Node          string `json:"node"`
	ServerTime    int64  `json:"server_time"`
	HeartbeatMS   int64  `json:"heartbeat_ms"`
	IdleTimeoutMS int64  `json:"idle_timeout_ms"`
	Limits        Limits `json:"limits"`
	// MaxFileBytes is the largest file an upload may declare (0:
	// attachments are off); PartBytes the size of every part of an
	// upload but the last (docs/protocol.md, "Attachments").
	MaxFileBytes int64 `json:"max_file_bytes"`
	PartBytes    int64 `json:"part_bytes"`
	// WebPushKey is the server's VAPID public key, the
	// applicationServerKey of a browser's Web Push subscription (absent:
	// the server sends no Web Push; docs/push.md).
	WebPushKey string `json:"webpush_key,omitempty"`
	// Reactions are the emoji a react may add (chat.reactions), and
	// MaxReactionsPerUser how many of them one user may put on one
	// message (absent from a server before reactions).
	Reactions           []string `json:"reactions,omitempty"`
	MaxReactionsPerUser int      `json:"max_reactions_per_user,omitempty"`
}
