package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Attachments (docs/protocol.md, "Attachments"): Upload declares a file
// and sends its bytes in parts over HTTP to the URLs the server signs
// (Parley's own endpoint, or presigned S3 URLs in cluster mode: the bytes
// never pass through the gateway), ResumeUpload continues one after a
// restart, SendFile names the file in a message of kind file, Download
// fetches it (or its thumbnail, or a byte range) for a member.

// ErrFileChanged: the file given to ResumeUpload is not the one the
// upload declared (its size or SHA-256 differ); sending it would end in
// hash_mismatch and the upload's deletion.
var ErrFileChanged = errors.New("client: the file is not the one the upload declared")

// DefaultPartRetries is how often one part is tried before Upload gives up
// (UploadOptions.PartRetries).
const DefaultPartRetries = 5

// UploadOptions describe the file Upload sends.
type UploadOptions struct {
	// Name (1–255 bytes of UTF-8, no control characters, '/' or '\') and
	// MediaType ("type/subtype") are declared with the file.
	Name      string
	MediaType string
	// SHA256 is the file's SHA-256 in lowercase hex when the caller has
	// it (an encrypting caller computes it while writing); "" makes
	// Upload read the file once more to compute it.
	SHA256 string
	// Progress, when set, is called as bytes go out: sent of total. It
	// may go back when a part is sent again after a failure. It is
	// called from the uploading goroutine.
	Progress func(sent, total int64)
	// PartRetries is how often a part is tried (a failed PUT, an expired
	// URL) before Upload returns the last error; 0 is
	// DefaultPartRetries.
	PartRetries int
	// OnCreate, when set, is called with the upload's id as soon as the
	// server has declared it, before any byte is sent: a caller that
	// records it can ResumeUpload after a crash or restart.
	OnCreate func(protocol.UploadInfo)
}

// UploadCreate declares a file of size bytes with SHA-256 sha (lowercase
// hex) in convID (upload_create). Every call declares a new upload, so a
// lost answer is not repeated (ErrDisconnected, ErrTimeout): the
// orphaned declaration expires unused.
func (c *Client) UploadCreate(ctx context.Context, convID uint64, size int64, sha, mediaType, name string) (protocol.UploadInfo, error) {
	return c.upload(ctx, protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: convID, Size: size, SHA256: sha, MediaType: mediaType, Name: name}, once)
}

// UploadStatus reads where upload attachmentID stands (upload_status):
// Received parts arrived in order, so the next to send is Received+1.
func (c *Client) UploadStatus(ctx context.Context, attachmentID uint64) (protocol.UploadInfo, error) {
	return c.upload(ctx, protocol.Frame{Type: protocol.TypeUploadStatus, AttachmentID: attachmentID}, idempotent)
}

// UploadPart asks where part (1..Parts) of upload attachmentID goes
// (upload_part): the answer's URL takes exactly the part's bytes in one
// PUT until URLExpiresAt. A part beyond Received+1 is part_out_of_order.
func (c *Client) UploadPart(ctx context.Context, attachmentID uint64, part int) (protocol.UploadInfo, error) {
	return c.upload(ctx, protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: attachmentID, Part: part}, idempotent)
}

// UploadComplete checks the size and hash of upload attachmentID once
// every part is in (upload_complete); a hash that differs from the
// declared one is hash_mismatch, and the upload is deleted. Repeating it
// on a complete upload answers the same. On target s3 the server reads
// the file back to hash it, off the request path: while it does,
// upload_complete answers not_ready, which is sent again after its
// retry_after_ms until ctx ends.
func (c *Client) UploadComplete(ctx context.Context, attachmentID uint64) (protocol.UploadInfo, error) {
	return c.upload(ctx, protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: attachmentID}, idempotent)
}

func (c *Client) upload(ctx context.Context, f protocol.Frame, policy retryPolicy) (protocol.UploadInfo, error) {
	r, _, err := c.do(ctx, f, protocol.TypeUpload, policy)
	if err != nil {
		return protocol.UploadInfo{}, err
	}
	if r.Upload == nil {
		return protocol.UploadInfo{}, fmt.Errorf("%s: answer without upload", f.Type)
	}
	return *r.Upload, nil
}

// AttachmentURL returns a short-lived download URL of the file of message
// seq in convID, or of its thumbnail (attachment_url). A thumbnail still
// being made is not_ready, which is retried after the server's
// retry_after_ms until ctx ends.
func (c *Client) AttachmentURL(ctx context.Context, convID, seq uint64, thumbnail bool) (protocol.AttachmentInfo, error) {
	f := protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: convID, Seq: seq, Thumbnail: thumbnail}
	for attempt := 0; ; attempt++ {
		r, _, err := c.do(ctx, f, protocol.TypeAttachment, idempotent)
		var e *Error
		if errors.As(err, &e) && e.Code == protocol.CodeNotReady {
			delay := e.RetryAfter
			if delay == 0 {
				delay = c.bo.delay(attempt)
			}
			if !sleep(ctx, delay) {
				return protocol.AttachmentInfo{}, fmt.Errorf("%s: %w (last answer: %w)", f.Type, ctx.Err(), e)
			}
			continue
		}
		if err != nil {
			return protocol.AttachmentInfo{}, err
		}
		if r.Attachment == nil {
			return protocol.AttachmentInfo{}, fmt.Errorf("%s: answer without attachment", f.Type)
		}
		return *r.Attachment, nil
	}
}

// Upload sends size bytes of r as a file of convID: it hashes them
// (unless opts.SHA256 is given), declares the file, sends each part with
// an HTTP PUT to the URL the server signs for it (a failed part is sent
// again, up to opts.PartRetries times, with a fresh URL), and completes
// the upload. It returns the completed upload, whose AttachmentID
// SendFile names. An error after the declaration leaves the upload to
// ResumeUpload (opts.OnCreate gets its id) until it expires.
func (c *Client) Upload(ctx context.Context, convID uint64, r io.ReaderAt, size int64, opts UploadOptions) (protocol.UploadInfo, error) {
	if size < 0 {
		return protocol.UploadInfo{}, &Error{Code: protocol.CodeInvalidArgument, Msg: "negative size"}
	}
	sum := opts.SHA256
	if sum == "" {
		var err error
		if sum, err = hashReaderAt(r, size); err != nil {
			return protocol.UploadInfo{}, fmt.Errorf("upload: hash: %w", err)
		}
	}
	info, err := c.UploadCreate(ctx, convID, size, sum, opts.MediaType, opts.Name)
	if err != nil {
		return info, err
	}
	if opts.OnCreate != nil {
		opts.OnCreate(info)
	}
	return c.sendParts(ctx, info, r, opts)
}

// ResumeUpload continues upload attachmentID with the same file r (a
// new Client after a restart may do it): it asks where the upload stands
// and sends the parts from Received+1, then completes it. The file must
// be the declared one: its SHA-256 is checked first (opts.SHA256 skips
// the pass when the caller knows it), else ErrFileChanged. A complete
// upload is returned as it is.
func (c *Client) ResumeUpload(ctx context.Context, attachmentID uint64, r io.ReaderAt, opts UploadOptions) (protocol.UploadInfo, error) {
	info, err := c.UploadStatus(ctx, attachmentID)
	if err != nil {
		return info, err
	}
	if info.State != protocol.UploadUploading {
		return info, nil
	}
	sum := opts.SHA256
	if sum == "" {
		if sum, err = hashReaderAt(r, info.Size); err != nil {
			return info, fmt.Errorf("upload: hash: %w", err)
		}
	}
	if sum != info.SHA256 {
		return info, fmt.Errorf("upload %d: %w", attachmentID, ErrFileChanged)
	}
	return c.sendParts(ctx, info, r, opts)
}

// sendParts sends the parts of info from Received+1 and completes it.
func (c *Client) sendParts(ctx context.Context, info protocol.UploadInfo, r io.ReaderAt, opts UploadOptions) (protocol.UploadInfo, error) {
	tries := opts.PartRetries
	if tries <= 0 {
		tries = DefaultPartRetries
	}
	progress := func(sent int64) {
		if opts.Progress != nil {
			opts.Progress(sent, info.Size)
		}
	}
	partBytes := func(n int) (off, length int64) {
		off = int64(n-1) * info.PartSize
		return off, min(info.PartSize, info.Size-off)
	}
	if info.Received > 0 {
		off, length := partBytes(info.Received)
		progress(off + length)
	} else {
		progress(0)
	}
	stalled := 0 // rounds in a row that did not move past the part tried
	for part := info.Received + 1; part <= info.Parts; {
		off, length := partBytes(part)
		received, err := c.putPart(ctx, info, part, io.NewSectionReader(r, off, length), tries, func(n int64) { progress(off + n) })
		if err != nil {
			return info, err
		}
		// received is what the server has in order after this PUT: the
		// part itself, or more (a duplicate), or fewer when it has lost
		// some (then those are sent again).
		if received < part {
			if stalled++; stalled >= tries {
				return info, fmt.Errorf("upload %d: the server keeps answering %d parts received, at part %d", info.AttachmentID, received, part)
			}
		} else {
			stalled = 0
		}
		part = received + 1
	}
	done, err := c.UploadComplete(ctx, info.AttachmentID)
	if err != nil {
		return info, err
	}
	progress(info.Size)
	return done, nil
}

// putPart sends one part, asking for a URL before each attempt, and
// returns how many parts the server has in order afterwards.
func (c *Client) putPart(ctx context.Context, info protocol.UploadInfo, part int, body *io.SectionReader, tries int, sent func(int64)) (int, error) {
	var last error
	for attempt := 0; attempt < tries; attempt++ {
		if attempt > 0 {
			if !sleep(ctx, c.bo.delay(attempt-1)) {
				return 0, fmt.Errorf("upload %d part %d: %w (last error: %w)", info.AttachmentID, part, ctx.Err(), last)
			}
		}
		u, err := c.UploadPart(ctx, info.AttachmentID, part)
		if CodeOf(err) == protocol.CodePartOutOfOrder {
			// The server has fewer parts than this one needs: ask it.
			st, serr := c.UploadStatus(ctx, info.AttachmentID)
			if serr != nil {
				return 0, serr
			}
			return st.Received, nil
		}
		if err != nil {
			return 0, err
		}
		target, err := c.resolve(u.URL)
		if err != nil {
			return 0, fmt.Errorf("upload %d part %d: url: %w", info.AttachmentID, part, err)
		}
		received, err := c.put(ctx, target, body, sent)
		switch {
		case err == nil && u.Target == protocol.TargetS3:
			return part, nil // S3 answers no count; its parts are not deduplicated by order
		case err == nil:
			return max(received, part), nil
		case CodeOf(err) == protocol.CodePartOutOfOrder:
			return received, nil
		case CodeOf(err) == protocol.CodeSizeMismatch:
			return 0, fmt.Errorf("upload %d part %d: %w", info.AttachmentID, part, err)
		case ctx.Err() != nil:
			return 0, fmt.Errorf("upload %d part %d: %w", info.AttachmentID, part, ctx.Err())
		}
		c.log.Debug("client: part failed; retrying", "attachment", info.AttachmentID, "part", part, "err", err)
		last = err
	}
	return 0, fmt.Errorf("upload %d part %d: %d attempts failed: %w", info.AttachmentID, part, tries, last)
}

// put sends body to target and returns the received count a Parley
// endpoint answers (0 for S3, whose answer carries none).
func (c *Client) put(ctx context.Context, target string, body *io.SectionReader, sent func(int64)) (int, error) {
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, &countingReader{r: body, report: sent})
	if err != nil {
		return 0, err
	}
	req.ContentLength = body.Size()
	if body.Size() == 0 {
		req.Body = http.NoBody
	}
	req.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(body, 0, body.Size())), nil
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var ans struct {
		Received  int           `json:"received"`
		Duplicate bool          `json:"duplicate"`
		Code      protocol.Code `json:"code"`
		Error     string        `json:"error"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(raw, &ans)
	}
	if resp.StatusCode/100 == 2 {
		return ans.Received, nil
	}
	return ans.Received, httpError(resp, ans.Code, ans.Error, raw)
}

// httpError is the *Error of an HTTP refusal: the code of Parley's JSON
// error, or one made from the status (an S3 server answers XML).
func httpError(resp *http.Response, code protocol.Code, msg string, raw []byte) error {
	if code == "" {
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			code = protocol.CodeUnauthorized
		case http.StatusNotFound:
			code = protocol.CodeNotFound
		case http.StatusRequestEntityTooLarge:
			code = protocol.CodeTooLarge
		case http.StatusTooManyRequests:
			code = protocol.CodeRateLimited
		case http.StatusBadRequest:
			code = protocol.CodeInvalidArgument
		default:
			code = protocol.CodeInternal
		}
		msg = fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, raw)
	}
	e := &Error{Code: code, Msg: msg}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}

// countingReader reports how many bytes have been read through it.
type countingReader struct {
	r      io.Reader
	n      int64
	report func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n += int64(n)
		c.report(c.n)
	}
	return n, err
}

func hashReaderAt(r io.ReaderAt, size int64) (string, error) {
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(r, 0, size))
	if err != nil {
		return "", err
	}
	if n != size {
		return "", fmt.Errorf("%d bytes, not %d", n, size)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// resolve makes a URL of an upload or download answer absolute: a
// presigned S3 URL is, a path of Parley's own endpoints is relative to
// the HTTP origin of the server this client is connected to.
func (c *Client) resolve(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.IsAbs() {
		return u.String(), nil
	}
	base := c.cfg.servers()[0]
	c.mu.Lock()
	if c.mu.cur != nil && c.mu.cur.base != "" {
		base = c.mu.cur.base
	}
	c.mu.Unlock()
	b, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	switch b.Scheme {
	case "wss":
		b.Scheme = "https"
	default:
		b.Scheme = "http"
	}
	b.Path, b.RawPath, b.RawQuery, b.Fragment = "", "", "", ""
	return b.ResolveReference(u).String(), nil
}

// FileMessage is what the sender says of a file beside the upload's
// facts (name, size, media type, hash, and for images width, height and
// thumbnail, which the server fills in).
type FileMessage struct {
	Caption    string `json:"caption,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	// Width and Height of a video, or of an image the server could not
	// read: kept only when the server has none.
	Width  int `json:"width,omitempty"`
	Height int `json:"height,omitempty"`
}

// SendFile sends a message of kind file naming the completed upload
// attachmentID in plain conversation convID. Retried like Send; the
// message's body is the server's FileBody (ParseFileBody).
func (c *Client) SendFile(ctx context.Context, convID, attachmentID uint64, m FileMessage) (Ack, error) {
	return c.SendFileWithID(ctx, convID, NewClientMsgID(), attachmentID, m)
}

// SendFileWithID is SendFile with a caller-chosen client_msg_id.
func (c *Client) SendFileWithID(ctx context.Context, convID uint64, clientMsgID string, attachmentID uint64, m FileMessage) (Ack, error) {
	var body string
	if m != (FileMessage{}) {
		b, _ := json.Marshal(m)
		body = string(b)
	}
	return c.write(ctx, protocol.Frame{Type: protocol.TypeSend, ConvID: convID, ClientMsgID: clientMsgID, Kind: protocol.KindFile, AttachmentID: attachmentID, Body: body})
}

// ParseFileBody reads the body of a kind file message of a plain
// conversation.
func ParseFileBody(m protocol.Message) (protocol.FileBody, error) {
	var b protocol.FileBody
	if m.Kind != protocol.KindFile {
		return b, fmt.Errorf("client: message %d is of kind %q, not file", m.Seq, m.Kind)
	}
	if err := json.Unmarshal([]byte(m.Body), &b); err != nil {
		return b, fmt.Errorf("client: file body of message %d: %w", m.Seq, err)
	}
	return b, nil
}

// DownloadOptions choose what Download fetches.
type DownloadOptions struct {
	// Thumbnail fetches the thumbnail (JPEG) the server made of an image
	// instead of the file; while it is being made Download waits.
	Thumbnail bool
	// Offset and Length select a byte range (Length 0: to the end).
	Offset, Length int64
	// Retries is how often a failed transfer is taken up again, from
	// the byte it reached (0: DefaultPartRetries).
	Retries int
}

// Download writes the file of message seq in convID (or its thumbnail,
// or a range of it) to w: it asks for a download URL (attachment_url) and
// GETs it, with a Range header when a range is asked for. A transfer cut
// short is taken up from where it stopped, with a fresh URL. It returns
// the attachment's description and the bytes written.
func (c *Client) Download(ctx context.Context, convID, seq uint64, w io.Writer, opts DownloadOptions) (protocol.AttachmentInfo, int64, error) {
	if opts.Offset < 0 || opts.Length < 0 {
		return protocol.AttachmentInfo{}, 0, &Error{Code: protocol.CodeInvalidArgument, Msg: "negative offset or length"}
	}
	tries := opts.Retries
	if tries <= 0 {
		tries = DefaultPartRetries
	}
	var (
		written int64
		last    error
		info    protocol.AttachmentInfo
	)
	for attempt := 0; attempt < tries; attempt++ {
		if attempt > 0 && !sleep(ctx, c.bo.delay(attempt-1)) {
			return info, written, fmt.Errorf("download: %w (last error: %w)", ctx.Err(), last)
		}
		var err error
		if info, err = c.AttachmentURL(ctx, convID, seq, opts.Thumbnail); err != nil {
			return info, written, err
		}
		off := opts.Offset + written
		want := int64(-1) // to the end
		if opts.Length > 0 {
			want = opts.Length - written
		}
		n, done, err := c.get(ctx, info.URL, off, want, w)
		written += n
		if err == nil && done {
			return info, written, nil
		}
		var e *Error
		if errors.As(err, &e) && e.Code != protocol.CodeUnauthorized && !e.Retryable() {
			return info, written, err // refused: a retry gets the same answer
		}
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		if ctx.Err() != nil {
			return info, written, fmt.Errorf("download: %w", ctx.Err())
		}
		last = err
	}
	return info, written, fmt.Errorf("download: %d attempts failed: %w", tries, last)
}

// get copies bytes [off, off+want) (want < 0: to the end) of raw to w and
// reports whether the whole range arrived.
func (c *Client) get(ctx context.Context, raw string, off, want int64, w io.Writer) (int64, bool, error) {
	target, err := c.resolve(raw)
	if err != nil {
		return 0, false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, false, err
	}
	ranged := off > 0 || want >= 0
	switch {
	case want == 0:
		return 0, true, nil
	case want > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+want-1))
	case off > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", off))
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent:
	case resp.StatusCode == http.StatusOK && !ranged:
	case resp.StatusCode == http.StatusOK:
		// The server ignored the range: skip to it.
		if _, err := io.CopyN(io.Discard, resp.Body, off); err != nil {
			return 0, false, err
		}
	default:
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var ans struct {
			Code  protocol.Code `json:"code"`
			Error string        `json:"error"`
		}
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			_ = json.Unmarshal(raw, &ans)
		}
		if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && ans.Code == "" {
			ans.Code, ans.Error = protocol.CodeInvalidArgument, "range not satisfiable"
		}
		return 0, false, httpError(resp, ans.Code, ans.Error, raw)
	}
	src := io.Reader(resp.Body)
	if want > 0 {
		src = io.LimitReader(resp.Body, want)
	}
	n, err := io.Copy(w, src)
	if err != nil {
		return n, false, err
	}
	if want > 0 {
		return n, n == want, nil
	}
	// To the end: complete when the body had the length announced.
	return n, resp.ContentLength < 0 || n == resp.ContentLength, nil
}
