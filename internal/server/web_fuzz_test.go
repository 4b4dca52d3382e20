package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/protocol"
)

// FuzzOrigins: parsing an allowlist never yields blanks, an origin listed
// is allowed whatever its case, and a request without Origin always is.
func FuzzOrigins(f *testing.F) {
	for _, s := range []string{"", "*", "https://a.example, http://b:3000/", ",,", "HTTPS://X.Example"} {
		f.Add(s, "https://a.example")
	}
	f.Fuzz(func(t *testing.T, list, origin string) {
		o := ParseOrigins(list)
		r := httptest.NewRequest(http.MethodGet, "http://node.example/v1/ws", nil)
		for _, a := range o {
			if a == "" || a != strings.ToLower(a) {
				t.Fatalf("ParseOrigins(%q) has %q", list, a)
			}
			if !o.allows(strings.ToUpper(a), r) {
				t.Fatalf("listed origin %q refused", a)
			}
		}
		if !o.allows("", r) {
			t.Fatal("a request without Origin was refused")
		}
		_ = o.allows(origin, r)
	})
}

// FuzzDevTokenBody: any body answers either a token for the valid user it
// names or a documented error.
func FuzzDevTokenBody(f *testing.F) {
	for _, s := range []string{`{"user":"alice"}`, `{"user":" bob "}`, `{"user":""}`, `[]`, `{"user":1}`, "\xff", ``} {
		f.Add(s)
	}
	key := []byte(strings.Repeat("k", 32))
	s := &Server{cfg: config.Default(), devKey: key, now: time.Now}
	v, err := auth.NewVerifier(auth.Config{HS256Key: key})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		s.handleDevToken(w, httptest.NewRequest(http.MethodPost, "http://127.0.0.1:7480/v1/dev/token", strings.NewReader(body)))
		if w.Code != http.StatusOK {
			var e struct{ Code protocol.Code }
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
				t.Fatalf("error answer %q is not JSON", w.Body)
			}
			switch e.Code {
			case protocol.CodeBadFrame, protocol.CodeInvalidArgument, protocol.CodeTooLarge:
			default:
				t.Fatalf("undocumented code %q for %q", e.Code, body)
			}
			return
		}
		var tok DevToken
		if err := json.Unmarshal(w.Body.Bytes(), &tok); err != nil {
			t.Fatal(err)
		}
		id, err := v.Verify(tok.Token, time.Now())
		if err != nil || id.User != tok.User || !protocol.ValidID(tok.User) {
			t.Fatalf("body %q minted %+v (%v)", body, id, err)
		}
	})
}
