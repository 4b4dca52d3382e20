package push

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// note is one notification for one registration.
type note struct {
	reg    store.PushReg
	conv   uint64
	seq    uint64
	msgID  uint64
	e2e    bool
	group  bool
	sender string // preview sender or full; "" otherwise
	text   string // preview full; "" otherwise
	count  int    // the user's unread messages of the conversation (at least 1)
	badge  int    // the user's unread messages of every conversation
	// coalesced counts the notifications to this device the rate limit
	// held back that this one stands for.
	coalesced int
}

// collapseID names the conversation's notification: a later one replaces
// it on the device (APNs apns-collapse-id, FCM collapse_key and tag, Web
// Push Topic), and so does a repeated one.
func (n note) collapseID() string { return "c" + strconv.FormatUint(n.conv, 36) }

// title and body of an alert (a plain conversation).
func (n note) alert() (title, body string) {
	body = fmt.Sprintf("%d new messages", n.count)
	if n.count == 1 {
		body = "New message"
	}
	if n.sender == "" {
		return "Parley", body
	}
	if n.text != "" && n.count == 1 {
		return n.sender, n.text
	}
	if n.text != "" {
		return n.sender, fmt.Sprintf("%s (%d new messages)", n.text, n.count)
	}
	return n.sender, body
}

// Outcomes of a send.
type outcome int

const (
	sent   outcome = iota
	gone           // the provider says the token is not registered: remove it
	retry          // try again later (after result.after if set)
	failed         // refused for good (a payload or configuration error): not retried
)

type result struct {
	outcome outcome
	after   time.Duration // Retry-After
	err     error
}

// provider sends one notification.
type provider interface {
	send(ctx context.Context, n note) result
}

// retryAfter reads a Retry-After header (seconds or an HTTP date).
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// readError reads at most 64 KiB of an error answer's JSON into v.
func readError(resp *http.Response, v any) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = json.Unmarshal(b, v)
}

// statusResult classifies a status no provider-specific rule decided.
func statusResult(resp *http.Response, now time.Time, what string) result {
	err := fmt.Errorf("%s: status %d", what, resp.StatusCode)
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return result{outcome: retry, after: retryAfter(resp.Header, now), err: err}
	}
	return result{outcome: failed, err: err}
}
