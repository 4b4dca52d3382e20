package attach

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

func TestSafeType(t *testing.T) {
	for media, want := range map[string]string{
		"image/png":                 "image/png",
		"IMAGE/JPEG":                "image/jpeg",
		"image/gif":                 "image/gif",
		"image/webp":                "image/webp",
		"image/png;x=1":             "image/png",
		"image/svg+xml":             "application/octet-stream",
		"text/html":                 "application/octet-stream",
		"text/html;charset=utf-8":   "application/octet-stream",
		"application/xhtml+xml":     "application/octet-stream",
		"text/xml":                  "application/octet-stream",
		"application/javascript":    "application/octet-stream",
		"text/plain":                "text/plain; charset=utf-8",
		"text/plain;charset=latin1": "text/plain; charset=utf-8",
		"audio/ogg":                 "audio/ogg",
		"audio/webm;codecs=opus":    "audio/webm; codecs=opus",
		"video/mp4":                 "video/mp4",
		"application/pdf":           "application/octet-stream",
		"not a type":                "application/octet-stream",
		"":                          "application/octet-stream",
	} {
		if got := safeType(media); got != want {
			t.Errorf("safeType(%q) = %q, want %q", media, got, want)
		}
	}
}

func TestDisposition(t *testing.T) {
	for _, tc := range []struct{ media, name, want string }{
		{"image/png", "cat.png", "inline; filename*=UTF-8''cat.png"},
		{"image/svg+xml", "x.svg", "attachment; filename*=UTF-8''x.svg"},
		{"text/html", "page.html", "attachment; filename*=UTF-8''page.html"},
		{"audio/ogg", "voice note.ogg", "attachment; filename*=UTF-8''voice%20note.ogg"},
		{"application/pdf", `a"b;c.pdf`, "attachment; filename*=UTF-8''a%22b%3Bc.pdf"},
		{"text/plain", "Grüße.txt", "attachment; filename*=UTF-8''Gr%C3%BC%C3%9Fe.txt"},
		{"application/octet-stream", "", "attachment"},
	} {
		if got := disposition(tc.media, tc.name); got != tc.want {
			t.Errorf("disposition(%q, %q) = %q, want %q", tc.media, tc.name, got, tc.want)
		}
	}
}

func TestGetMsg(t *testing.T) {
	// The signed string of docs/protocol.md: fields one per line.
	if got, want := getMsg(5, 7, 9, "bob", true, 1234), "get\n5\n7\n9\nbob\n1\n1234"; got != want {
		t.Fatalf("getMsg = %q, want %q", got, want)
	}
	if got, want := getMsg(5, 7, 9, "bob", false, 1234), "get\n5\n7\n9\nbob\n0\n1234"; got != want {
		t.Fatalf("getMsg = %q, want %q", got, want)
	}
}

// FuzzComposeBody: any body a sender gives either fails with a documented
// code or yields a FileBody whose server fields are the record's.
func FuzzComposeBody(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"caption":"hi","duration_ms":5}`, `{"width":-1}`, `[1]`, `"x"`, `{"caption":"\u0000"}`, `{"name":"evil","size":1}`} {
		f.Add(s)
	}
	a := store.Attachment{ID: 9, Name: "n.png", Size: 3, MediaType: "image/png", Width: 2, Height: 3, Thumb: store.ThumbPending}
	f.Fuzz(func(t *testing.T, body string) {
		out, perr := composeBody(store.Conversation{ID: 1}, a, body, 4096)
		if perr != nil {
			switch perr.Code {
			case protocol.CodeInvalidArgument, protocol.CodeTooLarge:
				return
			}
			t.Fatalf("undocumented code %s for %q", perr.Code, body)
		}
		var fb protocol.FileBody
		if err := json.Unmarshal([]byte(out), &fb); err != nil || len(out) > 4096 {
			t.Fatalf("composed %q: %v", out, err)
		}
		if fb.AttachmentID != 9 || fb.Name != "n.png" || fb.Size != 3 || fb.MediaType != "image/png" || fb.Width != 2 || fb.Height != 3 || fb.Thumbnail != protocol.ThumbPending {
			t.Fatalf("server fields overwritten by %q: %+v", body, fb)
		}
	})
}

// FuzzParseDownload: no URL but one the service signed passes.
func FuzzParseDownload(f *testing.F) {
	s := &Service{cfg: Config{Key: make([]byte, KeyBytes), URLTTL: time.Minute}, now: func() time.Time { return time.UnixMilli(1000) }}
	signed := map[string]bool{s.contentURL(5, 7, 9, "bob", false, 5000): true, s.contentURL(5, 7, 9, "bob", true, 5000): true}
	for u := range signed {
		f.Add(u)
	}
	f.Add("/v1/files/5?conv=7&seq=9&user=bob&exp=5000&sig=")
	f.Add("/v1/files/x")
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		d, perr := s.parseDownload(&http.Request{URL: u})
		if perr != nil {
			if perr.Code != protocol.CodeUnauthorized {
				t.Fatalf("code %s for %q", perr.Code, raw)
			}
			return
		}
		if again := s.contentURL(d.id, d.conv, d.seq, d.user, d.thumb, 5000); !signed[again] {
			t.Fatalf("%q passed as %+v, which the service never signed", raw, d)
		}
	})
}
