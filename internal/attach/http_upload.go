package attach

import (
	"crypto/sha256"
	"encoding"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// UploadPrefix starts the path of Parley's upload endpoint:
// PUT /v1/uploads/<id>/parts/<n>.
const UploadPrefix = "/v1/uploads/"

// UploadHandler serves PUT /v1/uploads/<id>/parts/<n>?exp=&sig= (the URLs
// upload_part answers on the embedded target): the body is exactly part n's
// bytes; the URL's signature is its only credential.
func (s *Service) UploadHandler() http.Handler { return http.HandlerFunc(s.servePart) }

// partAnswer is the body of a 200 (and, with Code, of a 409
// part_out_of_order, which says how far the upload got).
type partAnswer struct {
	AttachmentID uint64 `json:"attachment_id,string"`
	Received     int    `json:"received"`
	Duplicate    bool   `json:"duplicate,omitempty"`
}

func (s *Service) servePart(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", "PUT")
		writeError(w, http.StatusMethodNotAllowed, protocol.Errorf(protocol.CodeInvalidArgument, "PUT the part's bytes"))
		return
	}
	ids, ns, ok := parsePartPath(r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, protocol.Errorf(protocol.CodeNotFound, "no such upload part"))
		return
	}
	q := r.URL.Query()
	exps := q.Get("exp")
	exp, err := strconv.ParseInt(exps, 10, 64)
	if err != nil || !s.signed(partMsg(ids, ns, exps), q.Get("sig")) {
		writeError(w, http.StatusUnauthorized, protocol.Errorf(protocol.CodeUnauthorized, "the URL's signature is not valid; ask upload_part for a URL"))
		return
	}
	if s.now().UnixMilli() > exp {
		writeError(w, http.StatusUnauthorized, protocol.Errorf(protocol.CodeUnauthorized, "the URL expired at %s; ask upload_part for a new one", time.UnixMilli(exp).UTC().Format(time.RFC3339)))
		return
	}
	id, _ := strconv.ParseUint(ids, 10, 64)
	n, _ := strconv.Atoi(ns)
	// One part at a time per upload: the hash state a part carries on
	// must be the one of the bytes stored before it.
	if !s.begin(id) {
		writeError(w, http.StatusConflict, protocol.Errorf(protocol.CodeConflict, "a part of this upload is being received; send the parts one after another"))
		return
	}
	defer s.end(id)
	ctx := r.Context()
	a, err := s.att.Attachment(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && a.State == store.AttachDeleting {
		writeError(w, http.StatusNotFound, protocol.Errorf(protocol.CodeNotFound, "no such upload"))
		return
	}
	if err != nil {
		writePErr(w, s.storeErr("upload", err))
		return
	}
	received := a.Received
	if a.State != store.AttachUploading {
		received = partCount(a)
	}
	switch {
	case n > partCount(a):
		writeError(w, http.StatusBadRequest, protocol.Errorf(protocol.CodeInvalidArgument, "the upload has %d parts, part %d is not one", partCount(a), n))
		return
	case n <= received:
		writeJSON(w, http.StatusOK, partAnswer{AttachmentID: id, Received: received, Duplicate: true})
		return
	case n > received+1:
		writeJSON(w, http.StatusConflict, struct {
			Code  protocol.Code `json:"code"`
			Error string        `json:"error"`
			partAnswer
		}{protocol.CodePartOutOfOrder, "parts 1.." + strconv.Itoa(received) + " are received; the next is " + strconv.Itoa(received+1), partAnswer{AttachmentID: id, Received: received}})
		return
	}
	want := partSize(a, n)
	if r.ContentLength >= 0 && r.ContentLength != want {
		writeError(w, http.StatusBadRequest, sizeMismatch(n, want))
		return
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(a.HashState); err != nil {
		writePErr(w, protocol.Errorf(protocol.CodeInternal, "hash state: %v", err))
		return
	}
	// At most one byte past the part is read: enough to tell it is too
	// long. The engine streams the bytes to its store through its own
	// small buffer and syncs them before it returns.
	body := io.TeeReader(io.LimitReader(r.Body, want+1), h)
	if _, err := s.bs.PutPart(ctx, FileKey(id), a.BlobUpload, n, body, want); err != nil {
		if errors.Is(err, blob.ErrSize) {
			writeError(w, http.StatusBadRequest, sizeMismatch(n, want))
			return
		}
		writePErr(w, s.blobErr("upload part", err))
		return
	}
	st, err := h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		writePErr(w, protocol.Errorf(protocol.CodeInternal, "hash state: %v", err))
		return
	}
	next := a
	next.Received, next.HashState = n, st
	if err := s.att.UpdateAttachment(ctx, next, a); err != nil {
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			// Deleted (expired) meanwhile: the part is the GC's.
			writeError(w, http.StatusNotFound, protocol.Errorf(protocol.CodeNotFound, "no such upload"))
			return
		}
		writePErr(w, s.storeErr("upload part", err))
		return
	}
	writeJSON(w, http.StatusOK, partAnswer{AttachmentID: id, Received: n})
}

func sizeMismatch(n int, want int64) *protocol.Error {
	return protocol.Errorf(protocol.CodeSizeMismatch, "part %d has exactly %d bytes; it is not counted", n, want)
}

// parsePartPath reads /v1/uploads/<id>/parts/<n> (canonical decimal
// numbers, id > 0, n in 1..MaxUploadParts).
func parsePartPath(path string) (id, n string, ok bool) {
	rest, ok := strings.CutPrefix(path, UploadPrefix)
	if !ok {
		return "", "", false
	}
	id, n, ok = strings.Cut(rest, "/parts/")
	if !ok || !canonical(id) || !canonical(n) {
		return "", "", false
	}
	if x, err := strconv.ParseUint(id, 10, 64); err != nil || x == 0 {
		return "", "", false
	}
	if x, err := strconv.Atoi(n); err != nil || x < 1 || x > protocol.MaxUploadParts {
		return "", "", false
	}
	return id, n, true
}

// canonical reports whether s is a decimal number without a leading zero.
func canonical(s string) bool {
	if s == "" || len(s) > 20 || s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// begin marks upload id's part as being received by this process; false
// if one already is.
func (s *Service) begin(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.receiving[id] {
		return false
	}
	s.mu.receiving[id] = true
	return true
}

func (s *Service) end(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.receiving, id)
}

// writeError writes {"code","error"} with status, like every HTTP error of
// the node.
func writeError(w http.ResponseWriter, status int, e *protocol.Error) {
	writeJSON(w, status, struct {
		Code  protocol.Code `json:"code"`
		Error string        `json:"error"`
	}{e.Code, e.Msg})
}

// writePErr writes e with its code's HTTP status.
func writePErr(w http.ResponseWriter, e *protocol.Error) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt((e.RetryAfter+999)/1000, 10))
	}
	writeError(w, protocol.HTTPStatus(e.Code), e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
