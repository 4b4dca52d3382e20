package webhook

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"
)

var (
	secret = []byte("whsec-test-0123456789")
	t0     = time.Unix(1_900_000_000, 0)
)

func headers(ts time.Time, sig string) http.Header {
	h := http.Header{}
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	if sig != "" {
		h.Set(HeaderSignature, sig)
	}
	return h
}

func TestVerify(t *testing.T) {
	body := []byte(`{"id":"1.2.message.created"}`)
	good := Sign(secret, t0, body)
	tests := []struct {
		name string
		h    http.Header
		body []byte
		now  time.Time
		want error
	}{
		{"ok", headers(t0, good), body, t0, nil},
		{"ok within tolerance", headers(t0, good), body, t0.Add(4 * time.Minute), nil},
		{"ok among several", headers(t0, "v1=00ff "+good+",v0=zz"), body, t0, nil},
		{"too old", headers(t0, good), body, t0.Add(6 * time.Minute), ErrTimestamp},
		{"from the future", headers(t0, good), body, t0.Add(-6 * time.Minute), ErrTimestamp},
		{"body changed", headers(t0, good), []byte(`{"id":"1.3.message.created"}`), t0, ErrSignature},
		{"timestamp changed", headers(t0.Add(time.Second), good), body, t0, ErrSignature},
		{"wrong secret", headers(t0, Sign([]byte("other"), t0, body)), body, t0, ErrSignature},
		{"no signature", headers(t0, ""), body, t0, ErrNoSignature},
		{"no v1", headers(t0, good[3:]), body, t0, ErrSignature},
		{"no timestamp", http.Header{HeaderSignature: {good}}, body, t0, ErrTimestamp},
		{"timestamp +1900000000", http.Header{HeaderTimestamp: {"+1900000000"}, HeaderSignature: {good}}, body, t0, ErrTimestamp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Verify(secret, tt.h, tt.body, tt.now, DefaultTolerance)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestID(t *testing.T) {
	if got := ID(12, 3, MemberAdded); got != "12.3.member.added" {
		t.Fatalf("ID = %q", got)
	}
}

// FuzzVerify: no header or body makes Verify panic or accept a signature
// that was not made with the secret over that timestamp and body.
func FuzzVerify(f *testing.F) {
	body := []byte(`{"id":"1.2.message.created"}`)
	f.Add("1900000000", Sign(secret, t0, body), body)
	f.Add("1900000000", "v1=", body)
	f.Add("", "", []byte{})
	f.Add("-1", "v1=zz, v1=00", []byte("x"))
	f.Fuzz(func(t *testing.T, ts, sig string, b []byte) {
		h := http.Header{HeaderTimestamp: {ts}, HeaderSignature: {sig}}
		if Verify(secret, h, b, t0, DefaultTolerance) == nil {
			sec, _ := strconv.ParseInt(ts, 10, 64)
			want := Sign(secret, time.Unix(sec, 0), b)
			found := false
			for i := 0; i+len(want) <= len(sig); i++ {
				if sig[i:i+len(want)] == want {
					found = true
				}
			}
			if !found {
				t.Fatalf("accepted ts=%q sig=%q body=%q", ts, sig, b)
			}
		}
	})
}
