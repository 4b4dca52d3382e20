package store

import "context"

// Exporter is implemented by engines that can list everything they hold,
// for `parley migrate`, which copies an embedded node's store into a
// cluster's through the Store methods of the target. The listings are
// read from the engine as it is; the caller keeps it from changing (the
// node is stopped).
type Exporter interface {
	// ExportConversations lists the conversations with ID > after, by ID,
	// up to limit.
	ExportConversations(ctx context.Context, after uint64, limit int) ([]Conversation, error)
	// ExportMembers lists every membership of conv, former ones included
	// (LeaveSeq set), by user id.
	ExportMembers(ctx context.Context, conv uint64) ([]Member, error)
	// ExportPositions calls fn for every read and delivered position.
	ExportPositions(ctx context.Context, fn func(Position) error) error
	// ExportKeys calls fn for every device of the key directory with the
	// one-time prekeys it still holds (Curve25519, then ML-KEM).
	ExportKeys(ctx context.Context, fn func(d DeviceKeys, prekeys, kem []PreKey) error) error
	// ExportAttachments lists the attachment records with ID > after, by
	// ID, up to limit.
	ExportAttachments(ctx context.Context, after uint64, limit int) ([]Attachment, error)
	// ExportPushRegs lists every device's push registrations.
	ExportPushRegs(ctx context.Context) ([]PushReg, error)
	// ExportKTKeys returns the key transparency log's stored keys (nil:
	// none yet) without storing any.
	ExportKTKeys(ctx context.Context) ([]byte, error)
	// ExportNotify calls fn, by user id, for every user with notification
	// preferences: the conversations muted (conversation → mute-until,
	// none: nil) and the do-not-disturb (zero: none).
	ExportNotify(ctx context.Context, fn func(user string, mutes map[uint64]int64, dnd DND) error) error
}

// Position is one stored position: a read position of (User, Device,
// ConvID) (Device "" the per-user one), or with Delivered the delivered
// position of (User, ConvID).
type Position struct {
	User      string
	Device    string
	ConvID    uint64
	Seq       uint64
	Delivered bool
}

// ExporterOf returns the Exporter of s's engine (behind Check), ok false
// when the engine has none.
func ExporterOf(s Store) (Exporter, bool) {
	e, ok := Engine(s).(Exporter)
	return e, ok
}
