package gateway

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestRefusalLogAtMostOncePerSecond: a storm of refusals of one reason
// writes one line per second, the next one counting those left out; other
// reasons are not held back.
func TestRefusalLogAtMostOncePerSecond(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1000, 0)
	g := &Gateway{log: slog.New(slog.NewTextHandler(&out, nil)), now: func() time.Time { return now }}
	r := httptest.NewRequest("GET", "/v1/ws?device=d", nil)
	for range 5 {
		g.logRefusal(slog.LevelWarn, "full", r, "u1")
	}
	g.logRefusal(slog.LevelInfo, "bad_token", r, "")
	now = now.Add(1100 * time.Millisecond)
	g.logRefusal(slog.LevelWarn, "full", r, "u2")
	g.logRefusal(slog.LevelDebug, "full", r, "u3") // below the handler's level: not counted either

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), out.String())
	}
	for i, want := range []string{
		`level=WARN msg="request refused" reason=full remote=192.0.2.1:1234 path=/v1/ws user=u1`,
		`level=INFO msg="request refused" reason=bad_token remote=192.0.2.1:1234 path=/v1/ws`,
		`level=WARN msg="request refused" reason=full remote=192.0.2.1:1234 path=/v1/ws user=u2 suppressed=4`,
	} {
		if !strings.HasSuffix(lines[i], want) {
			t.Errorf("line %d = %q, want it to end with %q", i, lines[i], want)
		}
	}
}
