package push

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// providers is one local HTTP/2 (TLS) server speaking the three
// providers' documented contracts, recording every notification request:
//
//   - APNs: POST /3/device/<token>, authorization bearer ES256 JWT (kid,
//     iss, iat) of the test key; 200 with apns-id; 410 Unregistered; 400
//     BadDeviceToken; 429 TooManyRequests with Retry-After for tokens
//     set to throttle.
//   - FCM: POST /token (RFC 7523 jwt-bearer grant, an RS256 assertion of
//     the service account) answers an access token; POST
//     /v1/projects/<p>/messages:send with it: 200 {"name"}, 404
//     UNREGISTERED.
//   - Web Push: POST /wp/<id>, aes128gcm body decrypted with the
//     subscription's private key, VAPID "vapid t=<ES256 JWT>, k=<key>"
//     with aud the origin; 201, 410 for gone subscriptions.
type providers struct {
	t   *testing.T
	srv *httptest.Server

	apnsKey  *ecdsa.PrivateKey
	fcmKey   *rsa.PrivateKey
	vapidKey *ecdsa.PrivateKey
	dir      string

	mu        sync.Mutex
	reqs      []pushReq
	throttle  map[string]int // token → 429s left
	wpKeys    map[string]*ecdh.PrivateKey
	wpAuth    map[string][]byte
	tokenReqs int
}

// pushReq is one notification request as the provider received it.
type pushReq struct {
	Provider string
	Token    string
	Header   http.Header
	Payload  map[string]any
	At       time.Time
}

func newProviders(t *testing.T) *providers {
	p := &providers{t: t, dir: t.TempDir(), throttle: map[string]int{}, wpKeys: map[string]*ecdh.PrivateKey{}, wpAuth: map[string][]byte{}}
	var err error
	if p.apnsKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if p.vapidKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if p.fcmKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	return p
}

func (p *providers) fail(w http.ResponseWriter, format string, args ...any) {
	p.t.Errorf("provider: "+format, args...)
	http.Error(w, fmt.Sprintf(format, args...), http.StatusBadRequest)
}

func (p *providers) serve(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		p.fail(w, "%s %s over %s, want HTTP/2", r.Method, r.URL.Path, r.Proto)
		return
	}
	body, _ := io.ReadAll(r.Body)
	switch {
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/3/device/"):
		p.apns(w, r, strings.TrimPrefix(r.URL.Path, "/3/device/"), body)
	case r.Method == http.MethodPost && r.URL.Path == "/token":
		p.oauth(w, r, body)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/projects/parley-test/messages:send":
		p.fcm(w, r, body)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/wp/"):
		p.webpush(w, r, body)
	default:
		p.fail(w, "unexpected %s %s", r.Method, r.URL.Path)
	}
}

func (p *providers) record(provider, token string, r *http.Request, payload map[string]any) {
	p.mu.Lock()
	p.reqs = append(p.reqs, pushReq{Provider: provider, Token: token, Header: r.Header.Clone(), Payload: payload, At: time.Now()})
	p.mu.Unlock()
}

func (p *providers) throttled(token string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.throttle[token] > 0 {
		p.throttle[token]--
		return true
	}
	return false
}

func (p *providers) apns(w http.ResponseWriter, r *http.Request, token string, body []byte) {
	auth := r.Header.Get("authorization")
	tok, err := jwt.Parse(strings.TrimPrefix(auth, "bearer "), func(t *jwt.Token) (any, error) {
		if t.Header["kid"] != "KEYID12345" {
			return nil, fmt.Errorf("kid %v", t.Header["kid"])
		}
		return &p.apnsKey.PublicKey, nil
	}, jwt.WithValidMethods([]string{"ES256"}), jwt.WithIssuedAt())
	if err != nil || !strings.HasPrefix(auth, "bearer ") {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"reason":"InvalidProviderToken"}`)
		p.t.Errorf("apns: authorization %q: %v", auth, err)
		return
	}
	if iss, _ := tok.Claims.GetIssuer(); iss != "TEAMID1234" {
		p.fail(w, "apns: iss %q", iss)
		return
	}
	for _, h := range []string{"apns-topic", "apns-push-type", "apns-priority", "apns-collapse-id", "apns-expiration"} {
		if r.Header.Get(h) == "" {
			p.fail(w, "apns: no %s", h)
			return
		}
	}
	var payload map[string]any
	if err := json.Unmarshal(body, &payload); err != nil || len(body) > 4096 {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"reason":"PayloadTooLarge"}`)
		return
	}
	switch {
	case strings.HasPrefix(token, "dead"):
		w.WriteHeader(http.StatusGone)
		fmt.Fprintf(w, `{"reason":"Unregistered","timestamp":%d}`, time.Now().UnixMilli())
		return
	case strings.HasPrefix(token, "bad"):
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"reason":"BadDeviceToken"}`)
		return
	case p.throttled(token):
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"reason":"TooManyRequests"}`)
		return
	}
	p.record("apns", token, r, payload)
	w.Header().Set("apns-id", "8D1F1E3A-0000-4000-8000-"+fmt.Sprintf("%012d", len(p.requests())))
	w.WriteHeader(http.StatusOK)
}

func (p *providers) oauth(w http.ResponseWriter, r *http.Request, body []byte) {
	form, _ := url.ParseQuery(string(body))
	if form.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		p.fail(w, "oauth: grant_type %q", form.Get("grant_type"))
		return
	}
	tok, err := jwt.Parse(form.Get("assertion"), func(*jwt.Token) (any, error) { return &p.fcmKey.PublicKey, nil }, jwt.WithValidMethods([]string{"RS256"}))
	if err != nil {
		p.fail(w, "oauth: assertion: %v", err)
		return
	}
	c := tok.Claims.(jwt.MapClaims)
	if c["iss"] != "pusher@parley-test.iam.gserviceaccount.com" || c["scope"] != fcmScope || c["aud"] != p.srv.URL+"/token" {
		p.fail(w, "oauth: claims %v", c)
		return
	}
	p.mu.Lock()
	p.tokenReqs++
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"access_token":"ya29.parley-test","token_type":"Bearer","expires_in":3600}`)
}

func (p *providers) fcm(w http.ResponseWriter, r *http.Request, body []byte) {
	if r.Header.Get("Authorization") != "Bearer ya29.parley-test" {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}`)
		return
	}
	var m struct {
		Message map[string]any `json:"message"`
	}
	if err := json.Unmarshal(body, &m); err != nil || m.Message == nil {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}`)
		return
	}
	token, _ := m.Message["token"].(string)
	switch {
	case strings.HasPrefix(token, "dead"):
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}`)
		return
	case p.throttled(token):
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"code":429,"message":"Quota exceeded.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"}]}}`)
		return
	}
	p.record("fcm", token, r, m.Message)
	fmt.Fprint(w, `{"name":"projects/parley-test/messages/0:1764440000000000"}`)
}

func (p *providers) webpush(w http.ResponseWriter, r *http.Request, body []byte) {
	endpoint := p.srv.URL + r.URL.Path
	auth := r.Header.Get("Authorization")
	var jwtPart, kPart string
	for _, f := range strings.Split(strings.TrimPrefix(auth, "vapid "), ",") {
		f = strings.TrimSpace(f)
		if v, ok := strings.CutPrefix(f, "t="); ok {
			jwtPart = v
		} else if v, ok := strings.CutPrefix(f, "k="); ok {
			kPart = v
		}
	}
	want, _ := p.vapidKey.PublicKey.ECDH()
	if kPart != base64.RawURLEncoding.EncodeToString(want.Bytes()) {
		w.WriteHeader(http.StatusUnauthorized)
		p.t.Errorf("webpush: k=%q", kPart)
		return
	}
	tok, err := jwt.Parse(jwtPart, func(*jwt.Token) (any, error) { return &p.vapidKey.PublicKey, nil }, jwt.WithValidMethods([]string{"ES256"}),
		jwt.WithAudience(p.srv.URL), jwt.WithExpirationRequired())
	if err != nil {
		w.WriteHeader(http.StatusForbidden)
		p.t.Errorf("webpush: vapid jwt: %v", err)
		return
	}
	if sub, _ := tok.Claims.GetSubject(); sub != "mailto:ops@parley.example" {
		p.fail(w, "webpush: sub %q", sub)
		return
	}
	if r.Header.Get("Content-Encoding") != "aes128gcm" || r.Header.Get("TTL") == "" || r.Header.Get("Topic") == "" || r.Header.Get("Urgency") == "" {
		p.fail(w, "webpush: headers %v", r.Header)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/wp/dead") {
		w.WriteHeader(http.StatusGone)
		return
	}
	p.mu.Lock()
	ua, authSecret := p.wpKeys[endpoint], p.wpAuth[endpoint]
	p.mu.Unlock()
	pt, ok := decryptWebPush(ua, authSecret, body)
	if !ok {
		p.fail(w, "webpush: the body does not decrypt")
		return
	}
	var payload map[string]any
	if err := json.Unmarshal(pt, &payload); err != nil {
		p.fail(w, "webpush: payload %q", pt)
		return
	}
	p.record("webpush", endpoint, r, payload)
	w.Header().Set("Location", endpoint+"/msg/1")
	w.WriteHeader(http.StatusCreated)
}

// subscription makes a browser's subscription on the local push service.
func (p *providers) subscription(id string) (endpoint string, p256dh, auth []byte) {
	k, _ := ecdh.P256().GenerateKey(rand.Reader)
	a := make([]byte, 16)
	_, _ = rand.Read(a)
	endpoint = p.srv.URL + "/wp/" + id
	p.mu.Lock()
	p.wpKeys[endpoint], p.wpAuth[endpoint] = k, a
	p.mu.Unlock()
	return endpoint, k.PublicKey().Bytes(), a
}

// config writes the providers' key files and returns a Config on them.
func (p *providers) config() Config {
	write := func(name string, b []byte) string {
		f := filepath.Join(p.dir, name)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			p.t.Fatal(err)
		}
		return f
	}
	ak, _ := x509.MarshalPKCS8PrivateKey(p.apnsKey)
	vk, _ := x509.MarshalECPrivateKey(p.vapidKey)
	fk, _ := x509.MarshalPKCS8PrivateKey(p.fcmKey)
	sa, _ := json.Marshal(map[string]string{"type": "service_account", "project_id": "parley-test", "private_key_id": "k1",
		"private_key": string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: fk})), "client_email": "pusher@parley-test.iam.gserviceaccount.com",
		"token_uri": p.srv.URL + "/token"})
	c := DefaultConfig()
	c.Preview = PreviewFull
	c.Burst = 50 * time.Millisecond
	c.MinBackoff = 100 * time.Millisecond
	c.APNs = APNsConfig{KeyFile: write("apns.p8", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ak})), KeyID: "KEYID12345", TeamID: "TEAMID1234",
		URL: p.srv.URL, SandboxURL: p.srv.URL}
	c.FCM = FCMConfig{CredentialsFile: write("fcm.json", sa), URL: p.srv.URL}
	c.WebPush = WebPushConfig{VAPIDKeyFile: write("vapid.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: vk})), Subject: "mailto:ops@parley.example"}
	return c
}

func (p *providers) requests() []pushReq {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pushReq(nil), p.reqs...)
}

func benchKeys(t *testing.T) (*ecdsa.PrivateKey, *ecdsa.PrivateKey, *rsa.PrivateKey) {
	a, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	f, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return a, v, f
}
