package attach

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// The media type and name an upload to an end-to-end encrypted
// conversation declares: the server learns neither the real type nor the
// real name (both travel inside the encrypted message).
const (
	E2EMediaType = "application/octet-stream"
	E2EName      = "encrypted"
)

// uploadCreate declares a file: the caller must be allowed to send to the
// conversation; the record is created with the quota and the uploads in
// flight checked in the same write.
func (s *Service) uploadCreate(ctx context.Context, c protocol.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if f.Size > s.cfg.MaxFileBytes {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "a file has at most %d bytes (attach.max_file_bytes), got %d", s.cfg.MaxFileBytes, f.Size)
	}
	sum, err := hex.DecodeString(f.SHA256)
	if err != nil || len(sum) != sha256.Size {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "sha256 must be 64 lowercase hex digits")
	}
	cv, perr := s.sender(ctx, c.User, f.ConvID)
	if perr != nil {
		return nil, perr
	}
	if cv.E2E && (f.MediaType != E2EMediaType || f.Name != E2EName) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "an upload to an end-to-end encrypted conversation declares media_type %s and name %s (the real ones travel encrypted)", E2EMediaType, E2EName)
	}
	now := s.now()
	a := store.Attachment{
		ID: s.ids.Next(), Owner: c.User, Device: c.Device, ConvID: f.ConvID, Size: f.Size,
		MediaType: f.MediaType, Name: f.Name, State: store.AttachUploading,
		CreatedAt: now.UnixMilli(), ExpiresAt: now.Add(s.cfg.UnattachedTTL).UnixMilli(),
		PartSize: s.cfg.PartBytes,
	}
	copy(a.SHA256[:], sum)
	if s.pre == nil {
		// The bytes pass through this process: their hash is carried
		// part by part in the record.
		st, err := sha256.New().(encoding.BinaryMarshaler).MarshalBinary()
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeInternal, "hash state: %v", err)
		}
		a.HashState = st
	}
	up, err := s.bs.Create(ctx, FileKey(a.ID))
	if err != nil {
		return nil, s.blobErr("upload create", err)
	}
	a.BlobUpload = up
	if err := s.att.CreateAttachment(ctx, a, s.cfg.UserQuotaBytes, s.cfg.UploadsInFlight); err != nil {
		if aerr := s.bs.Abort(context.WithoutCancel(ctx), FileKey(a.ID), up); aerr != nil {
			s.log.Warn("abort of a refused upload failed", "attachment", a.ID, "err", aerr)
		}
		return nil, s.storeErr("upload create", err)
	}
	return s.uploadFrame(a, nil), nil
}

// sender returns the conversation if user may send to it: a current
// member, not muted.
func (s *Service) sender(ctx context.Context, user string, conv uint64) (store.Conversation, *protocol.Error) {
	m, err := s.st.Member(ctx, conv, user)
	switch {
	case err != nil:
		return store.Conversation{}, s.storeErr("member", err)
	case m.LeaveSeq != 0:
		return store.Conversation{}, protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	case m.Muted:
		return store.Conversation{}, protocol.Errorf(protocol.CodeForbidden, "muted in this conversation")
	}
	cv, err := s.st.Conversation(ctx, conv)
	if err != nil {
		return cv, s.storeErr("conversation", err)
	}
	return cv, nil
}

// owned returns c's record id; another user's, a missing one and one
// being deleted are not_found alike.
func (s *Service) owned(ctx context.Context, c protocol.Caller, id uint64) (store.Attachment, *protocol.Error) {
	a, err := s.att.Attachment(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return a, protocol.Errorf(protocol.CodeNotFound, "no such upload")
		}
		return a, s.storeErr("upload", err)
	}
	if a.Owner != c.User || a.State == store.AttachDeleting {
		return a, protocol.Errorf(protocol.CodeNotFound, "no such upload")
	}
	return a, nil
}

func (s *Service) uploadStatus(ctx context.Context, c protocol.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	a, perr := s.owned(ctx, c, f.AttachmentID)
	if perr != nil {
		return nil, perr
	}
	if a, perr = s.refresh(ctx, a); perr != nil {
		return nil, perr
	}
	return s.uploadFrame(a, nil), nil
}

// refresh brings an uploading record's Received up to the parts the
// engine holds when clients send parts to it directly (S3): the count of
// parts 1..k present with their right sizes. The record is updated when
// that count grew (best effort: another process may do the same).
func (s *Service) refresh(ctx context.Context, a store.Attachment) (store.Attachment, *protocol.Error) {
	if s.pre == nil || a.State != store.AttachUploading {
		return a, nil
	}
	parts, err := s.bs.Parts(ctx, FileKey(a.ID), a.BlobUpload)
	if errors.Is(err, blob.ErrNotFound) {
		// The engine joined the parts already: a completion is being
		// finished (its read back) or was cut short. Every part is in.
		if info, serr := s.bs.Stat(ctx, FileKey(a.ID)); serr == nil && info.Size == a.Size {
			a.Received = partCount(a)
			return a, nil
		}
	}
	if err != nil {
		return a, s.blobErr("upload parts", err)
	}
	n := inOrder(parts, a)
	if n <= a.Received {
		return a, nil
	}
	next := a
	next.Received = n
	if err := s.att.UpdateAttachment(ctx, next, a); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return s.reread(ctx, a.ID)
		}
		return a, s.storeErr("upload", err)
	}
	return next, nil
}

// reread returns the record again after a lost compare-and-set.
func (s *Service) reread(ctx context.Context, id uint64) (store.Attachment, *protocol.Error) {
	a, err := s.att.Attachment(ctx, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return a, protocol.Errorf(protocol.CodeNotFound, "no such upload")
		}
		return a, s.storeErr("upload", err)
	}
	if a.State == store.AttachDeleting {
		return a, protocol.Errorf(protocol.CodeNotFound, "no such upload")
	}
	return a, nil
}

// inOrder counts the parts 1..k that are present with the sizes a's file
// needs.
func inOrder(parts []blob.Part, a store.Attachment) int {
	total := partCount(a)
	n := 0
	for _, p := range parts {
		if p.N != n+1 || n+1 > total || p.Size != partSize(a, p.N) {
			break
		}
		n++
	}
	return n
}

// partCount is the number of parts of a's file; partSize the size of part
// n of it.
func partCount(a store.Attachment) int {
	if a.Size <= 0 {
		return 1
	}
	return int((a.Size + a.PartSize - 1) / a.PartSize)
}

func partSize(a store.Attachment, n int) int64 {
	if n < partCount(a) {
		return a.PartSize
	}
	return a.Size - int64(n-1)*a.PartSize
}

func (s *Service) uploadPart(ctx context.Context, c protocol.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	a, perr := s.owned(ctx, c, f.AttachmentID)
	if perr != nil {
		return nil, perr
	}
	if a.State != store.AttachUploading {
		return nil, protocol.Errorf(protocol.CodeConflict, "the upload is complete")
	}
	if a, perr = s.refresh(ctx, a); perr != nil {
		return nil, perr
	}
	if f.Part > partCount(a) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "the upload has %d parts, part %d is not one", partCount(a), f.Part)
	}
	if f.Part > a.Received+1 {
		return nil, &protocol.Error{Code: protocol.CodePartOutOfOrder,
			Msg: "parts 1.." + strconv.Itoa(a.Received) + " are received; the next is " + strconv.Itoa(a.Received+1)}
	}
	exp := s.now().Add(s.cfg.URLTTL)
	var u string
	if s.pre != nil {
		var err error
		u, err = s.pre.PresignPart(ctx, FileKey(a.ID), a.BlobUpload, f.Part, s.cfg.URLTTL)
		if err != nil {
			return nil, s.blobErr("presign part", err)
		}
	} else {
		u = s.partURL(a.ID, f.Part, exp.UnixMilli())
	}
	return s.uploadFrame(a, &protocol.UploadInfo{Part: f.Part, URL: u, URLExpiresAt: exp.UnixMilli()}), nil
}

// partURL is the signed URL of Parley's PUT endpoint for part n of upload
// id, valid until exp (unix ms); relative to the node's HTTP origin.
func (s *Service) partURL(id uint64, n int, exp int64) string {
	ids, ns, exps := strconv.FormatUint(id, 10), strconv.Itoa(n), strconv.FormatInt(exp, 10)
	return "/v1/uploads/" + ids + "/parts/" + ns + "?exp=" + exps + "&sig=" + url.QueryEscape(s.sign(partMsg(ids, ns, exps)))
}

// partMsg is what a part URL's signature covers.
func partMsg(id, n, exp string) string { return "put\n" + id + "\n" + n + "\n" + exp }

func (s *Service) uploadComplete(ctx context.Context, c protocol.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	a, perr := s.owned(ctx, c, f.AttachmentID)
	if perr != nil {
		return nil, perr
	}
	if a.State != store.AttachUploading {
		return s.uploadFrame(a, nil), nil // completed already: the same answer
	}
	key := FileKey(a.ID)
	if s.pre != nil {
		// A completion of this upload is being finished in this process
		// (its read back outlasted an earlier request): wait for it.
		if rb := s.readBackOf(a.ID); rb != nil {
			return s.awaitReadBack(ctx, rb)
		}
	}
	// One listing of the engine's parts serves both checks (the record's
	// Received lags the engine when clients send parts to it directly).
	parts, err := s.bs.Parts(ctx, key, a.BlobUpload)
	// joined: a completion cut short after the engine joined the parts
	// (a crash before the record was written, a read back given up); the
	// object is there, the checks that follow run on it.
	joined := false
	if errors.Is(err, blob.ErrNotFound) {
		if info, serr := s.bs.Stat(ctx, key); serr == nil && info.Size == a.Size {
			joined, err = true, nil
		}
	}
	if err != nil {
		return nil, s.blobErr("upload parts", err)
	}
	if !joined {
		received := a.Received
		if s.pre != nil {
			received = max(received, inOrder(parts, a))
		}
		if received < partCount(a) {
			return nil, protocol.Errorf(protocol.CodeUploadIncomplete, "%d of %d parts are received", received, partCount(a))
		}
		if len(parts) != partCount(a) || inOrder(parts, a) != len(parts) {
			s.discard(ctx, a)
			return nil, protocol.Errorf(protocol.CodeSizeMismatch, "the parts received do not add up to the declared size %d; the upload is deleted", a.Size)
		}
	}
	if s.pre == nil {
		// Every byte passed through this process: the hash is the one
		// carried in the record.
		var sum [sha256.Size]byte
		h := sha256.New()
		if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(a.HashState); err != nil {
			return nil, protocol.Errorf(protocol.CodeInternal, "hash state: %v", err)
		}
		copy(sum[:], h.Sum(nil))
		if sum != a.SHA256 {
			s.discard(ctx, a)
			return nil, hashMismatch()
		}
	}
	if !joined {
		if err := s.bs.Complete(ctx, key, a.BlobUpload, parts); err != nil {
			if errors.Is(err, blob.ErrBadParts) {
				s.discard(ctx, a)
				return nil, protocol.Errorf(protocol.CodeSizeMismatch, "the parts received do not make the declared file; the upload is deleted")
			}
			return nil, s.blobErr("upload complete", err)
		}
	}
	if s.pre == nil {
		return s.finish(ctx, a)
	}
	// The bytes went to the engine directly: they are read back and
	// hashed off the request path, so that the check does not depend on
	// one request's timeout; this request waits for it while it can.
	return s.awaitReadBack(ctx, s.startReadBack(a))
}

// finish marks a checked upload complete: its record, with an image's
// size and thumbnail state, then the thumbnail queued.
func (s *Service) finish(ctx context.Context, a store.Attachment) (*protocol.Frame, *protocol.Error) {
	next := a
	next.State, next.ExpiresAt = store.AttachComplete, s.now().Add(s.cfg.UnattachedTTL).UnixMilli()
	next.BlobUpload, next.HashState = "", nil
	cv, err := s.st.Conversation(ctx, a.ConvID)
	if err != nil {
		return nil, s.storeErr("conversation", err)
	}
	if !cv.E2E && imageTypes[a.MediaType] {
		s.probe(ctx, &next)
	}
	if err := s.att.UpdateAttachment(ctx, next, a); err != nil {
		if errors.Is(err, store.ErrConflict) {
			// Completed meanwhile (a retry on another connection), or
			// deleted.
			cur, perr := s.reread(ctx, a.ID)
			if perr != nil {
				return nil, perr
			}
			if cur.State != store.AttachUploading {
				return s.uploadFrame(cur, nil), nil
			}
		}
		return nil, s.storeErr("upload complete", err)
	}
	if next.Thumb == store.ThumbPending {
		s.queueThumb(next.ID)
	}
	return s.uploadFrame(next, nil), nil
}

// readBack is the read back of one S3 upload's joined file and the end
// of its completion, run off the request path: done is closed once f or
// perr (its outcome, what upload_complete answers) is set.
type readBack struct {
	done chan struct{}
	f    *protocol.Frame
	perr *protocol.Error
}

// Bounds of a read back: the longest it may take (then the completion
// answers store_unavailable and the next upload_complete starts it
// again), how long its outcome stays for a repeated upload_complete to
// answer (a refusal deletes the upload, so only this process can still
// tell why), and the retry_after_ms of the not_ready a request answers
// when the read back outlasts it.
const (
	readBackTimeout = 10 * time.Minute
	readBackKeep    = 10 * time.Minute
	readBackRetry   = 1000 // ms: retry_after_ms of not_ready
)

func (s *Service) readBackOf(id uint64) *readBack {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.readBacks[id]
}

// startReadBack starts (or joins) the read back of a's joined file.
func (s *Service) startReadBack(a store.Attachment) *readBack {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rb := s.mu.readBacks[a.ID]; rb != nil {
		return rb
	}
	rb := &readBack{done: make(chan struct{})}
	s.mu.readBacks[a.ID] = rb
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), readBackTimeout)
		defer cancel()
		rb.f, rb.perr = s.checkReadBack(ctx, a)
		close(rb.done)
		keep := readBackKeep
		if rb.perr != nil && rb.perr.Code == protocol.CodeStoreUnavailable {
			keep = 0 // the next upload_complete tries again
		}
		time.AfterFunc(keep, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.mu.readBacks[a.ID] == rb {
				delete(s.mu.readBacks, a.ID)
			}
		})
	}()
	return rb
}

// checkReadBack hashes a's joined file, deletes the upload if its size or
// SHA-256 is not the declared one, and completes it otherwise.
func (s *Service) checkReadBack(ctx context.Context, a store.Attachment) (*protocol.Frame, *protocol.Error) {
	n, got, err := s.hashBlob(ctx, FileKey(a.ID))
	if err != nil {
		return nil, s.blobErr("upload read back", err)
	}
	if n != a.Size {
		s.discard(ctx, a)
		return nil, protocol.Errorf(protocol.CodeSizeMismatch, "the file has %d bytes, %d were declared; the upload is deleted", n, a.Size)
	}
	if got != a.SHA256 {
		s.discard(ctx, a)
		return nil, hashMismatch()
	}
	return s.finish(ctx, a)
}

// awaitReadBack answers rb's outcome, or not_ready when it is not in
// before ctx's deadline (less a margin for the answer to travel back).
func (s *Service) awaitReadBack(ctx context.Context, rb *readBack) (*protocol.Frame, *protocol.Error) {
	var limit <-chan time.Time
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d)
		t := time.NewTimer(left - min(time.Second, left/5))
		defer t.Stop()
		limit = t.C
	}
	select {
	case <-rb.done:
		return rb.f, rb.perr
	case <-limit:
	case <-ctx.Done():
	}
	return nil, &protocol.Error{Code: protocol.CodeNotReady, RetryAfter: readBackRetry,
		Msg: "the file is being read back to check its SHA-256; send upload_complete again"}
}

func hashMismatch() *protocol.Error {
	return protocol.Errorf(protocol.CodeHashMismatch, "the file's SHA-256 is not the declared one; the upload is deleted")
}

// hashBlob reads key whole and returns its size and SHA-256.
func (s *Service) hashBlob(ctx context.Context, key string) (int64, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	r, _, err := s.bs.Open(ctx, key, 0, -1)
	if err != nil {
		return 0, sum, err
	}
	defer r.Close()
	h := sha256.New()
	buf := make([]byte, copyBuffer)
	n, err := io.CopyBuffer(h, r, buf)
	if err != nil {
		return 0, sum, err
	}
	copy(sum[:], h.Sum(nil))
	return n, sum, nil
}

// copyBuffer is the buffer bytes are streamed through (never a whole part
// or file in memory).
const copyBuffer = 64 << 10

// discard deletes an upload a lying client made: the record goes to
// deleting first (so no other request can complete or attach it), then
// its bytes and the record go; the GC finishes what a failure leaves.
func (s *Service) discard(ctx context.Context, a store.Attachment) {
	ctx = context.WithoutCancel(ctx)
	next := a
	next.State, next.ExpiresAt = store.AttachDeleting, 0
	if err := s.att.UpdateAttachment(ctx, next, a); err != nil {
		s.log.Warn("discard of an upload: mark deleting", "attachment", a.ID, "err", err)
		return
	}
	if err := s.remove(ctx, next); err != nil {
		s.log.Warn("discard of an upload: left to the GC", "attachment", a.ID, "err", err)
	}
}

// remove deletes a record in state deleting: its upload, file and
// thumbnail, then the record.
func (s *Service) remove(ctx context.Context, a store.Attachment) error {
	key := FileKey(a.ID)
	if a.BlobUpload != "" {
		if err := s.bs.Abort(ctx, key, a.BlobUpload); err != nil {
			return err
		}
	}
	if err := s.bs.Delete(ctx, key); err != nil {
		return err
	}
	if err := s.bs.Delete(ctx, ThumbKey(a.ID)); err != nil {
		return err
	}
	return s.att.DeleteAttachment(ctx, a.ID)
}

// uploadFrame is the upload answer for a, with extra's URL fields.
func (s *Service) uploadFrame(a store.Attachment, extra *protocol.UploadInfo) *protocol.Frame {
	info := &protocol.UploadInfo{
		AttachmentID: a.ID, ConvID: a.ConvID, Size: a.Size, SHA256: hex.EncodeToString(a.SHA256[:]),
		MediaType: a.MediaType, Name: a.Name, State: stateName(a.State),
		PartSize: a.PartSize, Parts: partCount(a), Received: a.Received, ExpiresAt: a.ExpiresAt,
		Target: s.Target(), Width: a.Width, Height: a.Height, Thumbnail: ThumbName(a.Thumb),
	}
	if a.State != store.AttachUploading {
		info.Received = info.Parts
	}
	if extra != nil {
		info.Part, info.URL, info.URLExpiresAt = extra.Part, extra.URL, extra.URLExpiresAt
	}
	return &protocol.Frame{Type: protocol.TypeUpload, Upload: info}
}

func stateName(st store.AttachState) string {
	switch st {
	case store.AttachUploading:
		return protocol.UploadUploading
	case store.AttachComplete:
		return protocol.UploadComplete
	case store.AttachAttached:
		return protocol.UploadAttached
	}
	return "deleting"
}

// ThumbName is a record's thumbnail state as the protocol names it.
func ThumbName(t uint8) string {
	switch t {
	case store.ThumbPending:
		return protocol.ThumbPending
	case store.ThumbReady:
		return protocol.ThumbReady
	case store.ThumbRefused:
		return protocol.ThumbRefused
	}
	return protocol.ThumbNone
}
