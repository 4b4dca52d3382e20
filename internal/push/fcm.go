package push

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"
)

// FCM HTTP v1: POST <url>/v1/projects/<project>/messages:send with an
// OAuth 2 access token of the service account (the JWT bearer grant of
// RFC 7523 against the account's token_uri, by golang.org/x/oauth2/jwt,
// cached until it expires and fetched again on a 401).
type fcm struct {
	url     string
	project string
	conf    *jwt.Config
	client  *http.Client
	now     func() time.Time

	mu sync.Mutex
	ts oauth2.TokenSource
}

const fcmScope = "https://www.googleapis.com/auth/firebase.messaging"

// serviceAccount is what FCM needs of a service account key file.
type serviceAccount struct {
	ClientEmail  string `json:"client_email"`
	PrivateKey   string `json:"private_key"`
	PrivateKeyID string `json:"private_key_id"`
	TokenURI     string `json:"token_uri"`
	ProjectID    string `json:"project_id"`
}

func newFCM(cfg FCMConfig, client *http.Client, now func() time.Time) (*fcm, error) {
	b, err := os.ReadFile(cfg.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("push: fcm credentials: %w", err)
	}
	var sa serviceAccount
	if err := json.Unmarshal(b, &sa); err != nil {
		return nil, fmt.Errorf("push: fcm credentials: %w", err)
	}
	if sa.ClientEmail == "" || sa.PrivateKey == "" || sa.TokenURI == "" {
		return nil, fmt.Errorf("push: fcm credentials %s: client_email, private_key and token_uri are required", cfg.CredentialsFile)
	}
	project := cfg.ProjectID
	if project == "" {
		project = sa.ProjectID
	}
	if project == "" {
		return nil, fmt.Errorf("push: fcm: no project_id in %s or fcm.project_id", cfg.CredentialsFile)
	}
	conf := &jwt.Config{Email: sa.ClientEmail, PrivateKey: []byte(sa.PrivateKey), PrivateKeyID: sa.PrivateKeyID,
		TokenURL: sa.TokenURI, Scopes: []string{fcmScope}}
	f := &fcm{url: cfg.URL, project: project, conf: conf, client: client, now: now}
	f.ts = f.source()
	return f, nil
}

func (f *fcm) source() oauth2.TokenSource {
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, f.client)
	return oauth2.ReuseTokenSource(nil, f.conf.TokenSource(ctx))
}

func (f *fcm) token(renew bool) (string, error) {
	f.mu.Lock()
	if renew {
		f.ts = f.source()
	}
	ts := f.ts
	f.mu.Unlock()
	t, err := ts.Token()
	if err != nil {
		return "", err
	}
	return t.AccessToken, nil
}

// fcmMessage is the v1 message: data always (strings), a notification
// only for a plain conversation; an E2E one is data-only (the app wakes,
// fetches and decrypts).
func fcmMessage(n note) []byte {
	data := map[string]string{"conv_id": strconv.FormatUint(n.conv, 10), "seq": strconv.FormatUint(n.seq, 10),
		"count": strconv.Itoa(n.count), "badge": strconv.Itoa(n.badge)}
	if n.coalesced > 0 {
		data["coalesced"] = strconv.Itoa(n.coalesced)
	}
	msg := map[string]any{"token": n.reg.Token, "data": data}
	android := map[string]any{"collapse_key": n.collapseID(), "priority": "HIGH", "ttl": "86400s"}
	if n.e2e {
		data["e2e"] = "1"
	} else {
		title, body := n.alert()
		msg["notification"] = map[string]string{"title": title, "body": body}
		android["notification"] = map[string]any{"tag": n.collapseID(), "notification_count": n.badge}
	}
	msg["android"] = android
	b, _ := json.Marshal(map[string]any{"message": msg})
	return b
}

// fcmError is the v1 error body.
type fcmError struct {
	Error struct {
		Code    int    `json:"code"`
		Status  string `json:"status"`
		Message string `json:"message"`
		Details []struct {
			Type      string `json:"@type"`
			ErrorCode string `json:"errorCode"`
		} `json:"details"`
	} `json:"error"`
}

func (e fcmError) code() string {
	for _, d := range e.Error.Details {
		if d.ErrorCode != "" {
			return d.ErrorCode
		}
	}
	return e.Error.Status
}

func (f *fcm) send(ctx context.Context, n note) result {
	for renewed := false; ; renewed = true {
		tok, err := f.token(renewed)
		if err != nil {
			return result{outcome: retry, err: fmt.Errorf("fcm: oauth token: %w", err)}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/projects/"+f.project+"/messages:send", bytes.NewReader(fcmMessage(n)))
		if err != nil {
			return result{outcome: failed, err: err}
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := f.client.Do(req)
		if err != nil {
			return result{outcome: retry, err: err}
		}
		var e fcmError
		if resp.StatusCode != http.StatusOK {
			readError(resp, &e)
		} else {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		}
		resp.Body.Close()
		code := e.code()
		switch {
		case resp.StatusCode == http.StatusOK:
			return result{outcome: sent}
		case code == "UNREGISTERED", resp.StatusCode == http.StatusNotFound:
			return result{outcome: gone, err: fmt.Errorf("fcm: %d %s", resp.StatusCode, code)}
		case resp.StatusCode == http.StatusUnauthorized && !renewed:
			continue // a fresh access token, once
		}
		r := statusResult(resp, f.now(), "fcm")
		if code != "" {
			r.err = fmt.Errorf("%w %s", r.err, code)
		}
		return r
	}
}
