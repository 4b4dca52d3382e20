package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/parley-im/parley/protocol"
)

// Attachment records: one per uploaded file, from upload_create until the
// file is deleted (expired unattached, recalled, deleted by the operator).
// The bytes live in the blob seam (internal/blob); a record says whose
// they are, for which conversation, how far the upload got and which
// message names the file. Each owner's usage (bytes of every record it
// owns, uploads in flight) is kept with the records, so that a quota is
// checked in the write that creates a record.

// Quota refusals of CreateAttachment.
var (
	ErrQuota    = errors.New("store: storage quota exceeded")
	ErrInflight = errors.New("store: too many uploads in flight")
)

// AttachState is where a record stands.
type AttachState uint8

const (
	AttachUploading AttachState = 1 // parts expected; counts as in flight
	AttachComplete  AttachState = 2 // size and hash checked, named by no message yet
	AttachAttached  AttachState = 3 // a message names it (RefClientMsgID, then RefSeq)
	AttachDeleting  AttachState = 4 // to delete: its blobs go, then the record (and its usage)
)

// Thumbnail states of a record.
const (
	ThumbNone    uint8 = 0 // not an image, or an E2E conversation
	ThumbPending uint8 = 1
	ThumbReady   uint8 = 2
	ThumbRefused uint8 = 3 // over the pixel limit or not decodable
)

// Attachment is one record.
type Attachment struct {
	ID        uint64
	Owner     string // user
	Device    string
	ConvID    uint64
	Size      int64
	SHA256    [32]byte
	MediaType string
	Name      string
	State     AttachState
	CreatedAt int64 // unix ms
	// ExpiresAt (unix ms): an uploading or complete record is deleted
	// then; 0 for attached and deleting ones.
	ExpiresAt int64
	// The upload: the blob engine's multipart upload id, the part size,
	// how many parts arrived in order, and (engines that pass the bytes
	// through Parley) the SHA-256 state after them (encoding.BinaryMarshaler
	// of crypto/sha256), so that a restarted process continues the hash.
	BlobUpload string
	PartSize   int64
	Received   int
	HashState  []byte
	// Images of plain conversations: dimensions and thumbnail state.
	Width, Height int
	Thumb         uint8
	// The message that names the file: its client_msg_id is recorded
	// before the message is stored, its seq once it is.
	RefClientMsgID string
	RefSeq         uint64
}

// Usage is one owner's share.
type Usage struct {
	Bytes    int64 // Size of every record the owner has
	Inflight int   // records in AttachUploading
}

// Bounds of attachment records and listings.
const (
	MaxAttachNameBytes  = 255
	MaxAttachMediaBytes = 127
	MaxAttachHashState  = 256
	MaxAttachPage       = 1000
)

// Attachments is the attachment part of a Store.
type Attachments interface {
	// CreateAttachment stores a new record (State AttachUploading) and adds
	// its Size and one upload in flight to the owner's usage, in one
	// conditional write: ErrQuota when the owner's bytes would pass quota,
	// ErrInflight when the owner already has inflight uploads in flight
	// (then nothing is stored); ErrExists if the id is taken.
	CreateAttachment(ctx context.Context, a Attachment, quota int64, inflight int) error
	// Attachment returns a record; ErrNotFound if none.
	Attachment(ctx context.Context, id uint64) (Attachment, error)
	// UpdateAttachment replaces record a.ID with a if the stored one still
	// has State prev.State and Received prev.Received (a compare-and-set:
	// ErrConflict otherwise, ErrNotFound if gone). Owner, ConvID, Size and
	// CreatedAt never change. Leaving AttachUploading takes one upload off
	// the owner's in-flight count.
	UpdateAttachment(ctx context.Context, a Attachment, prev Attachment) error
	// DeleteAttachment removes the record and takes its Size (and, if it
	// was uploading, its upload in flight) off the owner's usage; an
	// absent record is no error.
	DeleteAttachment(ctx context.Context, id uint64) error
	// ConvAttachments lists conv's records with ID > after, by ID, up to
	// limit (1..MaxAttachPage).
	ConvAttachments(ctx context.Context, conv uint64, after uint64, limit int) ([]Attachment, error)
	// DueAttachments lists up to limit (1..MaxAttachPage) records that
	// need work: ExpiresAt in (0, now], or, created at or before now,
	// State AttachDeleting or Thumb ThumbPending (a thumbnail a crash may
	// have left unmade; the caller judges by CreatedAt). A record is
	// listed once; the order is the engine's (roughly oldest first).
	DueAttachments(ctx context.Context, now int64, limit int) ([]Attachment, error)
	// AttachmentUsage is owner's usage (zero when it has no record).
	AttachmentUsage(ctx context.Context, owner string) (Usage, error)
}

// maxAttachRefBytes bounds the strings of a record the caller gets from
// elsewhere: the blob engine's upload id and the message's client_msg_id.
const maxAttachRefBytes = 1024

// validAttachment reports what is wrong with a record to store, "" if
// nothing: bounded strings, known states, no negative sizes.
func validAttachment(a Attachment) string {
	switch {
	case a.ID == 0:
		return "id 0"
	case !protocol.ValidID(a.Owner):
		return fmt.Sprintf("invalid owner %q", a.Owner)
	case !validDevice(a.Device, true):
		return fmt.Sprintf("invalid device %q", a.Device)
	case a.Size < 0 || a.PartSize < 0 || a.Received < 0 || a.Width < 0 || a.Height < 0:
		return fmt.Sprintf("negative size %d, part size %d, received %d or dimensions %dx%d", a.Size, a.PartSize, a.Received, a.Width, a.Height)
	case len(a.Name) > MaxAttachNameBytes:
		return fmt.Sprintf("name of %d bytes (at most %d)", len(a.Name), MaxAttachNameBytes)
	case len(a.MediaType) > MaxAttachMediaBytes:
		return fmt.Sprintf("media type of %d bytes (at most %d)", len(a.MediaType), MaxAttachMediaBytes)
	case len(a.HashState) > MaxAttachHashState:
		return fmt.Sprintf("hash state of %d bytes (at most %d)", len(a.HashState), MaxAttachHashState)
	case len(a.BlobUpload) > maxAttachRefBytes || len(a.RefClientMsgID) > maxAttachRefBytes:
		return fmt.Sprintf("blob upload or client_msg_id over %d bytes", maxAttachRefBytes)
	case a.State < AttachUploading || a.State > AttachDeleting:
		return fmt.Sprintf("invalid state %d", a.State)
	case a.Thumb > ThumbRefused:
		return fmt.Sprintf("invalid thumbnail state %d", a.Thumb)
	}
	return ""
}

func (c *checked) CreateAttachment(ctx context.Context, a Attachment, quota int64, inflight int) error {
	const op = "create attachment"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if bad := validAttachment(a); bad != "" {
		return fmt.Errorf("%s: %s %d: %s", c.name, op, a.ID, bad)
	}
	switch {
	case a.State != AttachUploading:
		return fmt.Errorf("%s: %s %d: state %d, a new record is uploading", c.name, op, a.ID, a.State)
	case quota < 0 || inflight < 0:
		return fmt.Errorf("%s: %s %d: negative quota %d or in-flight bound %d", c.name, op, a.ID, quota, inflight)
	}
	return c.e.CreateAttachment(ctx, a, quota, inflight)
}

func (c *checked) Attachment(ctx context.Context, id uint64) (Attachment, error) {
	const op = "attachment"
	if err := c.enter(ctx, op); err != nil {
		return Attachment{}, err
	}
	defer c.gate.RUnlock()
	if id == 0 {
		return Attachment{}, fmt.Errorf("%s: %s 0: %w", c.name, op, ErrNotFound)
	}
	return c.e.Attachment(ctx, id)
}

func (c *checked) UpdateAttachment(ctx context.Context, a Attachment, prev Attachment) error {
	const op = "update attachment"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if bad := validAttachment(a); bad != "" {
		return fmt.Errorf("%s: %s %d: %s", c.name, op, a.ID, bad)
	}
	switch {
	case prev.ID != a.ID:
		return fmt.Errorf("%s: %s %d: prev is record %d", c.name, op, a.ID, prev.ID)
	case a.Owner != prev.Owner || a.ConvID != prev.ConvID || a.Size != prev.Size || a.CreatedAt != prev.CreatedAt:
		return fmt.Errorf("%s: %s %d: owner, conversation, size or creation time changed", c.name, op, a.ID)
	case a.State == AttachUploading && prev.State != AttachUploading:
		return fmt.Errorf("%s: %s %d: back to uploading from state %d", c.name, op, a.ID, prev.State)
	case prev.State < AttachUploading || prev.State > AttachDeleting:
		return fmt.Errorf("%s: %s %d: prev has invalid state %d", c.name, op, a.ID, prev.State)
	}
	return c.e.UpdateAttachment(ctx, a, prev)
}

func (c *checked) DeleteAttachment(ctx context.Context, id uint64) error {
	if err := c.enterWrite(ctx, "delete attachment"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if id == 0 {
		return nil // no such record
	}
	return c.e.DeleteAttachment(ctx, id)
}

func (c *checked) ConvAttachments(ctx context.Context, conv uint64, after uint64, limit int) ([]Attachment, error) {
	const op = "conv attachments"
	if err := c.enter(ctx, op); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if limit < 1 || limit > MaxAttachPage {
		return nil, fmt.Errorf("%s: %s %d: limit %d outside 1..%d", c.name, op, conv, limit, MaxAttachPage)
	}
	if after == ^uint64(0) {
		return nil, nil // no id above
	}
	return c.e.ConvAttachments(ctx, conv, after, limit)
}

func (c *checked) DueAttachments(ctx context.Context, now int64, limit int) ([]Attachment, error) {
	const op = "due attachments"
	if err := c.enter(ctx, op); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if limit < 1 || limit > MaxAttachPage {
		return nil, fmt.Errorf("%s: %s: limit %d outside 1..%d", c.name, op, limit, MaxAttachPage)
	}
	return c.e.DueAttachments(ctx, now, limit)
}

func (c *checked) AttachmentUsage(ctx context.Context, owner string) (Usage, error) {
	if err := c.enter(ctx, "attachment usage"); err != nil {
		return Usage{}, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(owner) {
		return Usage{}, nil // owns nothing
	}
	return c.e.AttachmentUsage(ctx, owner)
}
