package store

import (
	"context"
	"errors"
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
	// need work: ExpiresAt in (0, now], State AttachDeleting, or Thumb
	// ThumbPending (a thumbnail a crash may have left unmade; the caller
	// judges by CreatedAt).
	DueAttachments(ctx context.Context, now int64, limit int) ([]Attachment, error)
	// AttachmentUsage is owner's usage (zero when it has no record).
	AttachmentUsage(ctx context.Context, owner string) (Usage, error)
}
