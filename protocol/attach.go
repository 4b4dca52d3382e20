package protocol

// Attachment frames (docs/protocol.md, "Attachments"): a client declares a
// file (conversation, size, SHA-256, media type, name), sends its bytes in
// parts to the URL each upload_part answer names — a presigned S3 URL in
// cluster mode, Parley's own upload endpoint on the embedded default —
// completes it, and then sends a message of kind "file" that names it in
// attachment_id. Members whose window covers that message get a short-lived
// download URL from attachment_url.

// Client frames of attachments.
const (
	TypeUploadCreate   = "upload_create"   // declare a file; answered by upload
	TypeUploadStatus   = "upload_status"   // where an upload stands (to resume); answered by upload
	TypeUploadPart     = "upload_part"     // the URL part N goes to; answered by upload
	TypeUploadComplete = "upload_complete" // check size and hash, make the file usable; answered by upload
	TypeAttachmentURL  = "attachment_url"  // a download URL for the file of message (conv_id, seq); answered by attachment
)

// Server frames of attachments.
const (
	TypeUpload     = "upload"     // answer to the upload_* frames
	TypeAttachment = "attachment" // answer to attachment_url
)

// KindFile is a message that carries one attachment, named by the message's
// attachment_id. In a plain conversation its body is a FileBody (JSON) the
// server completes from the upload; in an end-to-end encrypted one, the
// client's ciphertext.
const KindFile = "file"

// Attachment error codes (docs/protocol.md lists them).
const (
	CodeQuotaExceeded    Code = "quota_exceeded"    // the user's storage quota would be exceeded
	CodeTooManyUploads   Code = "too_many_uploads"  // the user has the most uploads in flight already
	CodeSizeMismatch     Code = "size_mismatch"     // a part or the file has more or fewer bytes than declared
	CodeHashMismatch     Code = "hash_mismatch"     // the completed file's SHA-256 is not the declared one
	CodePartOutOfOrder   Code = "part_out_of_order" // a part other than the next one expected
	CodeUploadIncomplete Code = "upload_incomplete" // the upload is not complete (completion before every part, a file message naming it)
	CodeNotReady         Code = "not_ready"         // the thumbnail is still being made, or an S3 upload's read back; retry after retry_after_ms
)

// Upload states.
const (
	UploadUploading = "uploading" // parts are expected
	UploadComplete  = "complete"  // size and hash checked; a message may name it
	UploadAttached  = "attached"  // a message names it
)

// Upload targets: where upload_part's URL points.
const (
	TargetParley = "parley" // Parley's upload endpoint (PUT, the URL is signed: no token needed)
	TargetS3     = "s3"     // a presigned S3 UploadPart URL (PUT)
)

// UploadInfo is the upload field of an upload answer.
type UploadInfo struct {
	AttachmentID uint64 `json:"attachment_id,string"`
	ConvID       uint64 `json:"conv_id,string"`
	Size         int64  `json:"size"`
	SHA256       string `json:"sha256"` // lowercase hex of the bytes uploaded
	MediaType    string `json:"media_type"`
	Name         string `json:"name"`
	State        string `json:"state"`
	// PartSize is the size of every part but the last; Parts their
	// number (1 for an empty file); Received how many arrived, in order
	// (parts 1..received), so the next part to send is received+1.
	PartSize int64 `json:"part_size"`
	Parts    int   `json:"parts"`
	Received int   `json:"received"`
	// ExpiresAt (unix ms): an upload not complete, or complete and named
	// by no message, is deleted then. 0 once attached.
	ExpiresAt int64  `json:"expires_at,omitempty"`
	Target    string `json:"target"`
	// URL and URLExpiresAt: on the answer to upload_part, where part Part
	// goes (PUT, exactly the part's bytes) and until when the URL works.
	Part         int    `json:"part,omitempty"`
	URL          string `json:"url,omitempty"`
	URLExpiresAt int64  `json:"url_expires_at,omitempty"`
	// Width and Height of an image in a plain conversation, read from its
	// header at completion; Thumbnail says whether a thumbnail is made:
	// "pending", "ready", "none" (not an image, or an E2E conversation),
	// "refused" (over the pixel limit or not decodable).
	Width     int    `json:"width,omitempty"`
	Height    int    `json:"height,omitempty"`
	Thumbnail string `json:"thumbnail,omitempty"`
}

// Thumbnail states.
const (
	ThumbPending = "pending"
	ThumbReady   = "ready"
	ThumbNone    = "none"
	ThumbRefused = "refused"
)

// AttachmentInfo is the attachment field of an attachment answer.
type AttachmentInfo struct {
	AttachmentID uint64 `json:"attachment_id,string"`
	ConvID       uint64 `json:"conv_id,string"`
	Seq          uint64 `json:"seq"`
	Size         int64  `json:"size"`
	SHA256       string `json:"sha256"`
	MediaType    string `json:"media_type"`
	Name         string `json:"name"`
	Width        int    `json:"width,omitempty"`
	Height       int    `json:"height,omitempty"`
	Thumbnail    string `json:"thumbnail,omitempty"`
	// URL (GET; Range requests work) and URLExpiresAt (unix ms): the
	// file, or its thumbnail when the request asked for it.
	URL          string `json:"url"`
	URLExpiresAt int64  `json:"url_expires_at"`
}

// FileBody is the body of a kind "file" message in a plain conversation.
// The sender gives Caption and DurationMS (and Width/Height of a video);
// the server fills the rest from the upload, overwriting what the client
// wrote there.
type FileBody struct {
	AttachmentID uint64 `json:"attachment_id,string"`
	Name         string `json:"name"`
	Size         int64  `json:"size"`
	MediaType    string `json:"media_type"`
	SHA256       string `json:"sha256"`
	Width        int    `json:"width,omitempty"`
	Height       int    `json:"height,omitempty"`
	DurationMS   int64  `json:"duration_ms,omitempty"`
	Thumbnail    string `json:"thumbnail,omitempty"`
	Caption      string `json:"caption,omitempty"`
}
