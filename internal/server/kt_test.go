package server

import (
	"strconv"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// FuzzQueryUint: a /v1/kt/ parameter is a decimal uint64 or
// invalid_argument, never anything else.
func FuzzQueryUint(f *testing.F) {
	for _, s := range []string{"", "0", "17", "18446744073709551615", "18446744073709551616", "-1", "1e3", " 5", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, perr := queryUint(map[string][]string{"from": {s}}, "from", true)
		if perr != nil {
			if perr.Code != protocol.CodeInvalidArgument {
				t.Fatalf("%q: code %s", s, perr.Code)
			}
			return
		}
		if strconv.FormatUint(n, 10) != s && !(s == "" || s[0] == '+' || s[0] == '0') {
			t.Fatalf("%q read as %d", s, n)
		}
	})
}

// TestSourceLimiter: a source past its burst waits, another source does
// not, and idle sources are forgotten.
func TestSourceLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newSourceLimiter(1, 2, func() time.Time { return now })
	for i := range 2 {
		if ok, _ := l.allow("10.0.0.1:555"); !ok {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	if ok, wait := l.allow("10.0.0.1:556"); ok || wait <= 0 || wait > time.Second {
		t.Fatalf("past the burst (another port, same address): %v %v", ok, wait)
	}
	if ok, _ := l.allow("10.0.0.2:555"); !ok {
		t.Fatal("another address limited")
	}
	now = now.Add(time.Second)
	if ok, _ := l.allow("10.0.0.1:1"); !ok {
		t.Fatal("no token after the refill")
	}
	now = now.Add(sourceIdle + time.Second)
	l.allow("10.0.0.3:1")
	if len(l.buckets) != 1 {
		t.Fatalf("%d buckets kept after the others went idle", len(l.buckets))
	}
}
