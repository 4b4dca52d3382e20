package attach

import (
	"context"
	"encoding/hex"
	"errors"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// The server API's side of attachments (internal/admin): list a
// conversation's records, delete one.

// AdminAttachment is one record as the server API lists it.
type AdminAttachment struct {
	AttachmentID uint64 `json:"attachment_id,string"`
	Owner        string `json:"owner"`
	Size         int64  `json:"size"`
	SHA256       string `json:"sha256"`
	MediaType    string `json:"media_type"`
	Name         string `json:"name"`
	// State is uploading, complete, attached or deleting.
	State     string `json:"state"`
	CreatedAt int64  `json:"created_at"`
	// Seq is the message that names the file (attached only, once
	// stored).
	Seq uint64 `json:"seq,omitempty"`
}

// AdminAttachments lists conv's records with an id above after, by id, up
// to limit (1..store.MaxAttachPage); more reports whether others follow.
// not_found if the conversation does not exist.
func (s *Service) AdminAttachments(ctx context.Context, conv, after uint64, limit int) (list []AdminAttachment, more bool, perr *protocol.Error) {
	if _, err := s.st.Conversation(ctx, conv); err != nil {
		return nil, false, s.storeErr("conversation", err)
	}
	recs, err := s.att.ConvAttachments(ctx, conv, after, min(limit+1, store.MaxAttachPage))
	if err != nil {
		return nil, false, s.storeErr("attachments", err)
	}
	if len(recs) > limit {
		recs, more = recs[:limit], true
	}
	list = make([]AdminAttachment, len(recs))
	for i, a := range recs {
		list[i] = AdminAttachment{AttachmentID: a.ID, Owner: a.Owner, Size: a.Size, SHA256: hex.EncodeToString(a.SHA256[:]),
			MediaType: a.MediaType, Name: a.Name, State: stateName(a.State), CreatedAt: a.CreatedAt, Seq: a.RefSeq}
	}
	return list, more, nil
}

// AdminDeleteAttachment deletes attachment id whatever its state: from the
// answer on, nothing serves it (the message naming it keeps showing, and
// attachment_url answers not_found). not_found if there is no such record.
// A failure answers store_unavailable: a retry is safe, and once the
// record is deleting the GC loop finishes the deletion anyway.
func (s *Service) AdminDeleteAttachment(ctx context.Context, id uint64) *protocol.Error {
	if _, err := s.att.Attachment(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return protocol.Errorf(protocol.CodeNotFound, "no attachment %d", id)
		}
		return s.storeErr("attachment", err)
	}
	if err := s.Purge(ctx, id); err != nil {
		s.log.Warn("admin API: attachment not deleted yet; the GC retries", "attachment", id, "err", err)
		return protocol.Errorf(protocol.CodeStoreUnavailable, "the attachment could not be deleted; retry")
	}
	return nil
}
