package attach

import (
	"context"
	"encoding/hex"
	"errors"
	"mime"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Downloads. attachment_url answers a member whose window covers the
// message (a current member, joined at or before it) a short-lived URL of
// the file or its thumbnail: on an engine clients reach directly (S3) a
// presigned GET, else Parley's own endpoint (ContentHandler), whose URL is
// signed and which checks the window again on every request, so that a
// removal takes effect at once there. Both serve the file with headers
// that keep it from running in a page (safeType, disposition).

// notReadyRetry is the retry_after_ms of a thumbnail still being made.
const notReadyRetry = 500

// window checks that user may download the file of message seq of conv
// and returns the message and its attachment record.
func (s *Service) window(ctx context.Context, user string, conv, seq uint64) (store.Message, store.Attachment, *protocol.Error) {
	mb, err := s.st.Member(ctx, conv, user)
	switch {
	case errors.Is(err, store.ErrNotMember), errors.Is(err, store.ErrNotFound):
		return store.Message{}, store.Attachment{}, protocol.Errorf(protocol.CodeNotMember, "not a member of this conversation")
	case err != nil:
		return store.Message{}, store.Attachment{}, s.storeErr("member", err)
	case mb.LeaveSeq != 0:
		return store.Message{}, store.Attachment{}, protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	case seq < mb.JoinSeq:
		return store.Message{}, store.Attachment{}, protocol.Errorf(protocol.CodeForbidden, "message %d is from before you joined (join_seq %d)", seq, mb.JoinSeq)
	}
	msgs, err := s.st.Messages(ctx, conv, seq, seq, 1)
	if err != nil {
		return store.Message{}, store.Attachment{}, s.storeErr("message", err)
	}
	if len(msgs) == 0 || msgs[0].Seq != seq {
		return store.Message{}, store.Attachment{}, protocol.Errorf(protocol.CodeNotFound, "no message %d in this conversation", seq)
	}
	m := msgs[0]
	switch {
	case m.Kind != protocol.KindFile:
		return m, store.Attachment{}, protocol.Errorf(protocol.CodeNotFound, "message %d is not a file message", seq)
	case m.Recalled:
		return m, store.Attachment{}, protocol.Errorf(protocol.CodeForbidden, "message %d is recalled", seq)
	case m.Attachment == 0:
		return m, store.Attachment{}, gone(seq)
	}
	a, err := s.att.Attachment(ctx, m.Attachment)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return m, a, gone(seq)
	case err != nil:
		return m, a, s.storeErr("attachment", err)
	case a.State != store.AttachAttached || a.ConvID != conv:
		return m, a, gone(seq)
	}
	return m, a, nil
}

func gone(seq uint64) *protocol.Error {
	return protocol.Errorf(protocol.CodeNotFound, "the file of message %d is deleted", seq)
}

// attachmentURL answers attachment_url.
func (s *Service) attachmentURL(ctx context.Context, c protocol.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	_, a, perr := s.window(ctx, c.User, f.ConvID, f.Seq)
	if perr != nil {
		return nil, perr
	}
	key, ctype, disp := FileKey(a.ID), safeType(a.MediaType), disposition(a.MediaType, a.Name)
	if f.Thumbnail {
		switch a.Thumb {
		case store.ThumbPending:
			return nil, &protocol.Error{Code: protocol.CodeNotReady, Msg: "the thumbnail is being made; retry", RetryAfter: notReadyRetry}
		case store.ThumbReady:
			key, ctype, disp = ThumbKey(a.ID), thumbType, "inline"
		default:
			return nil, protocol.Errorf(protocol.CodeNotFound, "attachment %d has no thumbnail", a.ID)
		}
	}
	exp := s.now().Add(s.cfg.URLTTL)
	var u string
	if s.pre != nil {
		var err error
		u, err = s.pre.PresignGet(ctx, key, s.cfg.URLTTL, blob.GetOptions{ContentType: ctype, ContentDisposition: disp})
		if err != nil {
			return nil, s.blobErr("presign", err)
		}
	} else {
		u = s.contentURL(a.ID, f.ConvID, f.Seq, c.User, f.Thumbnail, exp.UnixMilli())
	}
	return &protocol.Frame{Type: protocol.TypeAttachment, Attachment: &protocol.AttachmentInfo{
		AttachmentID: a.ID, ConvID: f.ConvID, Seq: f.Seq, Size: a.Size, SHA256: hex.EncodeToString(a.SHA256[:]),
		MediaType: a.MediaType, Name: a.Name, Width: a.Width, Height: a.Height, Thumbnail: ThumbName(a.Thumb),
		URL: u, URLExpiresAt: exp.UnixMilli(),
	}}, nil
}

// ContentPath is the path of Parley's download endpoint; the file of
// attachment id is under ContentPath + id.
const ContentPath = "/v1/files/"

// getMsg is what a download URL's signature covers.
func getMsg(id, conv, seq uint64, user string, thumb bool, exp int64) string {
	t := "0"
	if thumb {
		t = "1"
	}
	return "get\n" + strconv.FormatUint(id, 10) + "\n" + strconv.FormatUint(conv, 10) + "\n" + strconv.FormatUint(seq, 10) +
		"\n" + user + "\n" + t + "\n" + strconv.FormatInt(exp, 10)
}

// contentURL is the signed URL of Parley's endpoint for the file (or
// thumbnail) of message seq of conv, for user, until exp (unix ms),
// relative to the node's HTTP origin.
func (s *Service) contentURL(id, conv, seq uint64, user string, thumb bool, exp int64) string {
	var b strings.Builder
	b.WriteString(ContentPath)
	b.WriteString(strconv.FormatUint(id, 10))
	b.WriteString("?conv=")
	b.WriteString(strconv.FormatUint(conv, 10))
	b.WriteString("&seq=")
	b.WriteString(strconv.FormatUint(seq, 10))
	b.WriteString("&user=")
	b.WriteString(url.QueryEscape(user))
	if thumb {
		b.WriteString("&thumbnail=1")
	}
	b.WriteString("&exp=")
	b.WriteString(strconv.FormatInt(exp, 10))
	b.WriteString("&sig=")
	b.WriteString(s.sign(getMsg(id, conv, seq, user, thumb, exp)))
	return b.String()
}

// thumbType is the media type of every thumbnail.
const thumbType = "image/jpeg"

// inlineTypes are the media types served inline: images every browser
// decodes as images only, never as a document that runs script.
var inlineTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// safeType is the Content-Type a file of declared type media is served
// with: the declared type when it is one a browser only displays or plays
// (the inline images, audio/*, video/* with their parameters, text/plain
// as UTF-8), anything else application/octet-stream — an uploaded
// text/html or image/svg+xml is never rendered as what it claims.
func safeType(media string) string {
	mt, params, err := mime.ParseMediaType(media)
	switch {
	case err != nil:
	case inlineTypes[mt]:
		return mt
	case mt == "text/plain":
		return "text/plain; charset=utf-8"
	case strings.HasPrefix(mt, "audio/"), strings.HasPrefix(mt, "video/"):
		// Parameters such as codecs (a recorded voice note's
		// audio/webm;codecs=opus) help a player; FormatMediaType quotes
		// them so that nothing else rides along.
		if t := mime.FormatMediaType(mt, params); t != "" {
			return t
		}
	}
	return "application/octet-stream"
}

// inline reports whether a file of type media is shown in the page: the
// safe image types only.
func inline(media string) bool {
	mt, _, err := mime.ParseMediaType(media)
	return err == nil && inlineTypes[mt]
}

// disposition is the Content-Disposition of a file of type media named
// name: inline for the safe image types, an attachment (saved, never
// shown by the browser) otherwise, with the name as RFC 6266's filename*.
func disposition(media, name string) string {
	kind := "attachment"
	if inline(media) {
		kind = "inline"
	}
	if name == "" {
		return kind
	}
	return kind + "; filename*=UTF-8''" + rfc5987(name)
}

// rfc5987 percent-encodes s as an RFC 5987 value (attr-char kept).
func rfc5987(s string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			strings.IndexByte("!#$&+-.^_`|~", c) >= 0:
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

// urlTTLSeconds is the max-age of a served file: as long as its URL lasts.
func (s *Service) urlTTLSeconds() int64 { return int64(s.cfg.URLTTL / time.Second) }
