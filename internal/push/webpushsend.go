package push

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// webPush delivers to a subscription's endpoint (RFC 8030): the payload
// encrypted to the browser's keys (RFC 8291), VAPID authorization
// (RFC 8292), Topic (the conversation: a newer message replaces a pending
// one), Urgency high, TTL a day.
type webPush struct {
	v      *vapid
	client *http.Client
	now    func() time.Time
}

func newWebPush(cfg WebPushConfig, client *http.Client, now func() time.Time) (*webPush, error) {
	k, err := loadECKey(cfg.VAPIDKeyFile)
	if err != nil {
		return nil, fmt.Errorf("push: vapid key: %w", err)
	}
	v, err := newVAPID(k, cfg.Subject, now)
	if err != nil {
		return nil, err
	}
	return &webPush{v: v, client: client, now: now}, nil
}

// webPushPayload is what the service worker gets (decrypted by the
// browser): no title or text of an E2E conversation.
func webPushPayload(n note) []byte {
	p := map[string]any{"conv_id": strconv.FormatUint(n.conv, 10), "seq": n.seq, "count": n.count, "badge": n.badge}
	if n.coalesced > 0 {
		p["coalesced"] = n.coalesced
	}
	if n.e2e {
		p["e2e"] = true
	} else {
		p["title"], p["body"] = n.alert()
	}
	b, _ := json.Marshal(p)
	return b
}

func (w *webPush) send(ctx context.Context, n note) result {
	body, err := EncryptWebPush(webPushPayload(n), n.reg.P256dh, n.reg.Auth)
	if err != nil {
		return result{outcome: failed, err: err}
	}
	auth, err := w.v.header(n.reg.Token)
	if err != nil {
		return result{outcome: failed, err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.reg.Token, bytes.NewReader(body))
	if err != nil {
		return result{outcome: failed, err: err}
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Encoding", "aes128gcm")
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("TTL", "86400")
	req.Header.Set("Urgency", "high")
	req.Header.Set("Topic", n.collapseID())
	resp, err := w.client.Do(req)
	if err != nil {
		return result{outcome: retry, err: err}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		return result{outcome: sent}
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return result{outcome: gone, err: fmt.Errorf("webpush: %d", resp.StatusCode)}
	}
	return statusResult(resp, w.now(), "webpush")
}
