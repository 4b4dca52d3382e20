package attach

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// The message side of a file. A send of kind file names a complete upload
// of its sender in the same conversation: Attach marks the record with the
// message's client_msg_id before the message is stored (so a retry of the
// same send finds it again and another message cannot take it), Stored
// records the message's seq once it is. A recall deletes the file at once
// (Recalled): the record goes to deleting, its blobs and then the record
// are deleted, and whatever fails there the GC loop finishes.

// casAttempts bounds the compare-and-set retries on one record: other
// writers are the thumbnail worker and a concurrent send, each at most
// once or twice per record.
const casAttempts = 8

// fileInput is what the sender of a plain conversation's file message
// gives in its body; every other field of the stored FileBody is the
// server's.
type fileInput struct {
	Caption    string `json:"caption"`
	DurationMS int64  `json:"duration_ms"`
	Width      int    `json:"width"`
	Height     int    `json:"height"`
}

// Attach checks that the file of send f (kind file, naming f.AttachmentID)
// may be sent by user to cv, marks its record attached to f's
// client_msg_id, and returns the body to store with the message: in a
// plain conversation the FileBody the server composes from the record and
// the sender's caption, duration (and dimensions the server did not read),
// at most maxBody bytes; in an E2E one the sender's envelope as it is (the
// caller has checked its form). A retry of the same send (the same
// client_msg_id) answers as the first did.
func (s *Service) Attach(ctx context.Context, user string, cv store.Conversation, f *protocol.Frame, maxBody int) (string, uint64, *protocol.Error) {
	for range casAttempts {
		a, err := s.att.Attachment(ctx, f.AttachmentID)
		if errors.Is(err, store.ErrNotFound) {
			return "", 0, noFile(f.AttachmentID)
		}
		if err != nil {
			return "", 0, s.storeErr("attachment", err)
		}
		if a.Owner != user || a.ConvID != cv.ID {
			return "", 0, noFile(f.AttachmentID)
		}
		switch a.State {
		case store.AttachUploading:
			return "", 0, protocol.Errorf(protocol.CodeUploadIncomplete, "upload %d is not complete: send its remaining parts and upload_complete first", a.ID)
		case store.AttachDeleting:
			return "", 0, noFile(a.ID)
		case store.AttachAttached:
			if a.RefClientMsgID != f.ClientMsgID {
				return "", 0, protocol.Errorf(protocol.CodeConflict, "attachment %d is already sent in another message", a.ID)
			}
		}
		body, perr := composeBody(cv, a, f.Body, maxBody)
		if perr != nil {
			return "", 0, perr
		}
		if a.State == store.AttachAttached {
			return body, a.ID, nil
		}
		next := a
		next.State, next.ExpiresAt, next.RefClientMsgID = store.AttachAttached, 0, f.ClientMsgID
		switch err := s.att.UpdateAttachment(ctx, next, a); {
		case err == nil:
			return body, a.ID, nil
		case errors.Is(err, store.ErrConflict):
			continue // the thumbnail worker, or the same send on another device: read again
		case errors.Is(err, store.ErrNotFound):
			return "", 0, noFile(a.ID)
		default:
			return "", 0, s.storeErr("attach", err)
		}
	}
	return "", 0, &protocol.Error{Code: protocol.CodeOverloaded, Msg: "the attachment changed while it was being sent; retry", RetryAfter: 100}
}

func noFile(id uint64) *protocol.Error {
	return protocol.Errorf(protocol.CodeNotFound, "no attachment %d of yours in this conversation", id)
}

// composeBody is the stored body of a file message naming a (see Attach).
func composeBody(cv store.Conversation, a store.Attachment, body string, maxBody int) (string, *protocol.Error) {
	if cv.E2E {
		return body, nil
	}
	var in fileInput
	if body != "" {
		if err := json.Unmarshal([]byte(body), &in); err != nil {
			return "", protocol.Errorf(protocol.CodeInvalidArgument, "the body of a file message is a JSON object {caption, duration_ms, width, height}: %v", err)
		}
	}
	if in.DurationMS < 0 || in.Width < 0 || in.Height < 0 {
		return "", protocol.Errorf(protocol.CodeInvalidArgument, "duration_ms, width and height must not be negative")
	}
	fb := protocol.FileBody{
		AttachmentID: a.ID, Name: a.Name, Size: a.Size, MediaType: a.MediaType, SHA256: hex.EncodeToString(a.SHA256[:]),
		Width: a.Width, Height: a.Height, DurationMS: in.DurationMS, Thumbnail: ThumbName(a.Thumb), Caption: in.Caption,
	}
	if a.Width == 0 && a.Height == 0 {
		// Not an image the server read (a video, say): the sender knows.
		fb.Width, fb.Height = in.Width, in.Height
	}
	if fb.Thumbnail == protocol.ThumbNone {
		fb.Thumbnail = ""
	}
	out, err := json.Marshal(fb)
	if err != nil {
		return "", protocol.Errorf(protocol.CodeInternal, "encode the file body")
	}
	if len(out) > maxBody {
		return "", protocol.Errorf(protocol.CodeTooLarge, "the file message's body is %d bytes once composed, over max_body_bytes (%d): shorten the caption", len(out), maxBody)
	}
	return string(out), nil
}

// Stored records seq, the stored message that names attachment id (best
// effort: the record is attached already, RefSeq only tells the server
// API and the GC which message it is).
func (s *Service) Stored(ctx context.Context, id, seq uint64) {
	for range casAttempts {
		a, err := s.att.Attachment(ctx, id)
		if err != nil {
			s.log.Warn("attachment's seq not recorded", "attachment", id, "seq", seq, "err", err)
			return
		}
		if a.State != store.AttachAttached || a.RefSeq != 0 {
			return
		}
		next := a
		next.RefSeq = seq
		err = s.att.UpdateAttachment(ctx, next, a)
		if err == nil || errors.Is(err, store.ErrNotFound) {
			return
		}
		if !errors.Is(err, store.ErrConflict) {
			s.log.Warn("attachment's seq not recorded", "attachment", id, "seq", seq, "err", err)
			return
		}
	}
}

// Recalled deletes attachment id, whose message was just recalled; what
// fails is left to the GC loop (the record is deleting by then, or still
// attached to a recalled message if even that write failed).
func (s *Service) Recalled(ctx context.Context, id uint64) {
	if err := s.Purge(ctx, id); err != nil {
		s.log.Warn("recalled attachment not deleted yet; the GC retries", "attachment", id, "err", err)
	}
}

// Purge deletes attachment id: the record goes to deleting (from then on
// nothing serves the file), the file, its thumbnail and an unfinished
// multipart upload are deleted, then the record, which takes its bytes off
// the owner's usage. An absent record is no error. On failure the record
// stays deleting and a later Purge (the GC loop) finishes.
func (s *Service) Purge(ctx context.Context, id uint64) error {
	var a store.Attachment
	for i := 0; ; i++ {
		var err error
		a, err = s.att.Attachment(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if a.State == store.AttachDeleting {
			break
		}
		next := a
		next.State, next.ExpiresAt = store.AttachDeleting, 0
		err = s.att.UpdateAttachment(ctx, next, a)
		if err == nil {
			break
		}
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if !errors.Is(err, store.ErrConflict) || i+1 == casAttempts {
			return err
		}
	}
	return s.remove(ctx, a)
}
