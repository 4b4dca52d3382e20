package push

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// APNs over HTTP/2 with token authentication: a request per notification
// to <url>/3/device/<token>, authorization "bearer <ES256 JWT>" (kid: the
// key id, iss: the team id, iat), renewed every 40 minutes (Apple refuses
// one older than an hour and one renewed more often than every 20) or when
// APNs answers ExpiredProviderToken.
type apns struct {
	cfg    APNsConfig
	key    *ecdsa.PrivateKey
	client *http.Client
	now    func() time.Time

	mu    sync.Mutex
	token string
	iat   time.Time
}

const apnsTokenAge = 40 * time.Minute

func newAPNs(cfg APNsConfig, client *http.Client, now func() time.Time) (*apns, error) {
	k, err := loadECKey(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("push: apns key: %w", err)
	}
	return &apns{cfg: cfg, key: k, client: client, now: now}, nil
}

func (a *apns) bearer(renew bool) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.token == "" || renew || now.Sub(a.iat) >= apnsTokenAge {
		t := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": a.cfg.TeamID, "iat": now.Unix()})
		t.Header["kid"] = a.cfg.KeyID
		s, err := t.SignedString(a.key)
		if err != nil {
			return "", err
		}
		a.token, a.iat = s, now
	}
	return a.token, nil
}

// apnsPayload is the JSON body: an alert for a plain conversation, a
// background push (content-available, no alert, no sound) for an E2E one.
func apnsPayload(n note) []byte {
	aps := map[string]any{"badge": n.badge, "thread-id": n.collapseID()}
	if n.e2e {
		aps["content-available"] = 1
	} else {
		title, body := n.alert()
		aps["alert"] = map[string]string{"title": title, "body": body}
		aps["sound"] = "default"
	}
	body := map[string]any{"aps": aps, "conv_id": strconv.FormatUint(n.conv, 10), "seq": n.seq, "count": n.count}
	if n.coalesced > 0 {
		body["coalesced"] = n.coalesced
	}
	b, _ := json.Marshal(body)
	return b
}

func (a *apns) send(ctx context.Context, n note) result {
	base := a.cfg.URL
	if n.reg.Sandbox {
		base = a.cfg.SandboxURL
	}
	for renewed := false; ; renewed = true {
		bearer, err := a.bearer(renewed)
		if err != nil {
			return result{outcome: failed, err: err}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/3/device/"+n.reg.Token, bytes.NewReader(apnsPayload(n)))
		if err != nil {
			return result{outcome: failed, err: err}
		}
		req.Header.Set("authorization", "bearer "+bearer)
		req.Header.Set("apns-topic", n.reg.Topic)
		req.Header.Set("apns-collapse-id", n.collapseID())
		req.Header.Set("apns-expiration", strconv.FormatInt(a.now().Add(24*time.Hour).Unix(), 10))
		if n.e2e {
			req.Header.Set("apns-push-type", "background")
			req.Header.Set("apns-priority", "5") // Apple requires 5 for a background push
		} else {
			req.Header.Set("apns-push-type", "alert")
			req.Header.Set("apns-priority", "10")
		}
		req.Header.Set("content-type", "application/json")
		resp, err := a.client.Do(req)
		if err != nil {
			return result{outcome: retry, err: err}
		}
		var e struct {
			Reason string `json:"reason"`
		}
		if resp.StatusCode != http.StatusOK {
			readError(resp, &e)
		} else {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			return result{outcome: sent}
		case resp.StatusCode == http.StatusGone, e.Reason == "BadDeviceToken", e.Reason == "DeviceTokenNotForTopic", e.Reason == "Unregistered":
			return result{outcome: gone, err: fmt.Errorf("apns: %d %s", resp.StatusCode, e.Reason)}
		case resp.StatusCode == http.StatusForbidden && e.Reason == "ExpiredProviderToken" && !renewed:
			continue // a fresh JWT, once
		}
		r := statusResult(resp, a.now(), "apns")
		if e.Reason != "" {
			r.err = fmt.Errorf("%w %s", r.err, e.Reason)
		}
		return r
	}
}
