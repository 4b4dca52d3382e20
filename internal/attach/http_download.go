package attach

import (
	"context"
	"encoding/hex"
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

// ContentHandler serves GET (and HEAD) ContentPath<id>?conv&seq&user
// [&thumbnail=1]&exp&sig, the URLs attachment_url hands out on an engine
// clients cannot reach directly. The signature and expiry are checked
// first (401 unauthorized), then the window as attachment_url checks it
// (403 not_member or forbidden, 404 not_found), on every request. Range
// requests are answered 206 (a range beyond the file: 416).
func (s *Service) ContentHandler() http.Handler { return http.HandlerFunc(s.serveContent) }

// contentTimeout bounds the checks before the bytes flow (the store reads);
// the copy itself is bounded by the server's write timeout.
const contentTimeout = 10 * time.Second

// download is a parsed, signed download URL.
type download struct {
	id, conv, seq uint64
	user          string
	thumb         bool
}

func (s *Service) serveContent(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		httpError(w, http.StatusMethodNotAllowed, protocol.Errorf(protocol.CodeInvalidArgument, "GET or HEAD only"))
		return
	}
	d, perr := s.parseDownload(r)
	if perr != nil {
		httpError(w, protocol.HTTPStatus(perr.Code), perr)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), contentTimeout)
	m, a, perr := s.window(ctx, d.user, d.conv, d.seq)
	cancel()
	if perr == nil && m.Attachment != d.id {
		perr = gone(d.seq)
	}
	if perr == nil && d.thumb && a.Thumb != store.ThumbReady {
		perr = protocol.Errorf(protocol.CodeNotFound, "attachment %d has no thumbnail", a.ID)
	}
	if perr != nil {
		httpError(w, protocol.HTTPStatus(perr.Code), perr)
		return
	}
	key, ctype, disp, etag := FileKey(a.ID), safeType(a.MediaType), disposition(a.MediaType, a.Name), `"`+hex.EncodeToString(a.SHA256[:])+`"`
	if d.thumb {
		key, ctype, disp, etag = ThumbKey(a.ID), thumbType, "inline", `"t`+strconv.FormatUint(a.ID, 10)+`"`
	}
	// The object's size from the engine, before any header is written: a
	// blob gone meanwhile (a recall's deletion racing this request) is a
	// 404, not a truncated 200.
	ctx, cancel = context.WithTimeout(r.Context(), contentTimeout)
	info, err := s.bs.Stat(ctx, key)
	cancel()
	if err != nil {
		s.contentErr(w, a.ID, err)
		return
	}
	size := info.Size
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Disposition", disp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	h.Set("Cache-Control", "private, max-age="+strconv.FormatInt(s.urlTTLSeconds(), 10))
	h.Set("ETag", etag)
	rs := &blobReader{ctx: r.Context(), bs: s.bs, key: key, size: size}
	defer rs.Close()
	http.ServeContent(w, r, "", time.Time{}, rs)
	if rs.err != nil && !errors.Is(rs.err, context.Canceled) {
		s.log.Warn("attachment download failed", "attachment", a.ID, "err", rs.err)
	}
}

// parseDownload reads and authenticates a download URL.
func (s *Service) parseDownload(r *http.Request) (download, *protocol.Error) {
	bad := protocol.Errorf(protocol.CodeUnauthorized, "not a valid download URL: ask attachment_url for one")
	var d download
	idStr, ok := strings.CutPrefix(r.URL.Path, ContentPath)
	if !ok {
		return d, bad
	}
	q := r.URL.Query()
	var err1, err2, err3, err4 error
	d.id, err1 = strconv.ParseUint(idStr, 10, 64)
	d.conv, err2 = strconv.ParseUint(q.Get("conv"), 10, 64)
	d.seq, err3 = strconv.ParseUint(q.Get("seq"), 10, 64)
	exp, err4 := strconv.ParseInt(q.Get("exp"), 10, 64)
	d.user = q.Get("user")
	switch q.Get("thumbnail") {
	case "":
	case "1":
		d.thumb = true
	default:
		return d, bad
	}
	if errors.Join(err1, err2, err3, err4) != nil || !protocol.ValidID(d.user) {
		return d, bad
	}
	if !s.signed(getMsg(d.id, d.conv, d.seq, d.user, d.thumb, exp), q.Get("sig")) {
		return d, bad
	}
	if s.now().UnixMilli() > exp {
		return d, protocol.Errorf(protocol.CodeUnauthorized, "the download URL expired: ask attachment_url for another")
	}
	return d, nil
}

// contentErr answers a blob engine failure before any byte was sent.
func (s *Service) contentErr(w http.ResponseWriter, id uint64, err error) {
	if errors.Is(err, blob.ErrNotFound) {
		httpError(w, http.StatusNotFound, protocol.Errorf(protocol.CodeNotFound, "attachment %d is deleted", id))
		return
	}
	s.log.Warn("attachment download failed", "attachment", id, "err", err)
	httpError(w, http.StatusServiceUnavailable, protocol.Errorf(protocol.CodeStoreUnavailable, "the file could not be read; retry"))
}

// httpError writes the JSON error every Parley HTTP endpoint answers.
func httpError(w http.ResponseWriter, status int, e *protocol.Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": e.Code, "error": e.Msg})
}

// blobReader is an io.ReadSeeker over a blob of known size, for
// http.ServeContent: a seek only moves the offset, the next read opens the
// object from there (one engine read per range served).
type blobReader struct {
	ctx  context.Context
	bs   blob.Store
	key  string
	size int64
	off  int64
	rc   io.ReadCloser
	err  error // the engine's failure, if a read failed
}

func (b *blobReader) Seek(offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = b.off + offset
	case io.SeekEnd:
		abs = b.size + offset
	default:
		return 0, errors.New("attach: bad whence")
	}
	if abs < 0 {
		return 0, errors.New("attach: negative position")
	}
	if abs != b.off {
		b.Close()
	}
	b.off = abs
	return abs, nil
}

func (b *blobReader) Read(p []byte) (int, error) {
	if b.off >= b.size {
		return 0, io.EOF
	}
	if b.rc == nil {
		rc, _, err := b.bs.Open(b.ctx, b.key, b.off, -1)
		if err != nil {
			b.err = err
			return 0, err
		}
		b.rc = rc
	}
	n, err := b.rc.Read(p)
	b.off += int64(n)
	if err != nil && err != io.EOF {
		b.err = err
	}
	if err == io.EOF && b.off < b.size {
		b.err = io.ErrUnexpectedEOF
		return n, b.err
	}
	return n, err
}

// Close closes the open engine read, if any.
func (b *blobReader) Close() error {
	if b.rc == nil {
		return nil
	}
	err := b.rc.Close()
	b.rc = nil
	return err
}
