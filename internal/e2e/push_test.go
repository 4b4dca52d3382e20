package e2e

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/schema"
)

func webPushSub(t *testing.T, endpoint string) *protocol.PushRegistration {
	t.Helper()
	k, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	auth := make([]byte, 16)
	_, _ = rand.Read(auth)
	return &protocol.PushRegistration{Provider: protocol.PushWebPush, Endpoint: endpoint,
		P256dh: base64.RawURLEncoding.EncodeToString(k.PublicKey().Bytes()), Auth: base64.RawURLEncoding.EncodeToString(auth)}
}

func regKeys(f *protocol.Frame) []string {
	out := []string{}
	for _, r := range f.Registrations {
		out = append(out, r.Provider+":"+r.Key())
	}
	return out
}

// TestPushRegistrations: push_register and push_remove over a WebSocket
// and /v1/rpc — every provider's registration is stored and answered (the
// answers match frames.json), bad registrations get their documented
// codes and change nothing, the per-device bound holds, a token another
// user registers leaves the first, and keys_remove drops the device's.
func TestPushRegistrations(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	apns := &protocol.PushRegistration{Provider: protocol.PushAPNs, Token: strings.Repeat("ab", 32), Topic: "im.parley.app", Sandbox: true}
	f := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypePushRegister, Push: apns}), protocol.TypePush)
	if len(f.Registrations) != 1 || f.Registrations[0].Topic != "im.parley.app" || !f.Registrations[0].Sandbox || f.Registrations[0].UpdatedAt == 0 {
		t.Fatalf("push answer %+v", f.Registrations)
	}
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypePushRegister, Push: &protocol.PushRegistration{Provider: protocol.PushFCM, Token: "fcm-token:APA91b"}}), protocol.TypePush)
	wp := webPushSub(t, "https://push.example.net/send/abc")
	f = mustOK(t, alice.call(protocol.Frame{Type: protocol.TypePushRegister, Push: wp}), protocol.TypePush)
	if got := strings.Join(regKeys(f), " "); got != "apns:"+apns.Token+" fcm:fcm-token:APA91b webpush:https://push.example.net/send/abc" {
		t.Fatalf("registrations %s", got)
	}
	if f.Registrations[2].P256dh != wp.P256dh || f.Registrations[2].Auth != wp.Auth {
		t.Fatalf("web push keys not kept: %+v", f.Registrations[2])
	}

	bad := []struct {
		name string
		push *protocol.PushRegistration
		code protocol.Code
	}{
		{"no push", nil, protocol.CodeInvalidArgument},
		{"unknown provider", &protocol.PushRegistration{Provider: "gcm", Token: "x"}, protocol.CodeInvalidArgument},
		{"apns without topic", &protocol.PushRegistration{Provider: protocol.PushAPNs, Token: "aa"}, protocol.CodeInvalidArgument},
		{"token with a space", &protocol.PushRegistration{Provider: protocol.PushFCM, Token: "a b"}, protocol.CodeInvalidArgument},
		{"token too long", &protocol.PushRegistration{Provider: protocol.PushFCM, Token: strings.Repeat("a", protocol.MaxPushTokenBytes+1)}, protocol.CodeInvalidArgument},
		{"fcm with topic", &protocol.PushRegistration{Provider: protocol.PushFCM, Token: "a", Topic: "t"}, protocol.CodeInvalidArgument},
		{"webpush over http", func() *protocol.PushRegistration { r := webPushSub(t, "http://push.example.net/x"); return r }(), protocol.CodeInvalidArgument},
		{"webpush short auth", func() *protocol.PushRegistration {
			r := webPushSub(t, "https://p.example/x")
			r.Auth = "AAAA"
			return r
		}(), protocol.CodeInvalidArgument},
		{"webpush key off the curve", func() *protocol.PushRegistration {
			r := webPushSub(t, "https://p.example/x")
			r.P256dh = base64.RawURLEncoding.EncodeToString(append([]byte{4}, make([]byte, 64)...))
			return r
		}(), protocol.CodeInvalidArgument},
		{"updated_at set", &protocol.PushRegistration{Provider: protocol.PushFCM, Token: "a", UpdatedAt: 1}, protocol.CodeInvalidArgument},
		{"fifth registration", &protocol.PushRegistration{Provider: protocol.PushFCM, Token: "b"}, ""}, // the fourth is fine
		{"over the bound", &protocol.PushRegistration{Provider: protocol.PushFCM, Token: "c"}, protocol.CodeTooManyRegistrations},
	}
	for _, b := range bad {
		r := alice.call(protocol.Frame{Type: protocol.TypePushRegister, Push: b.push})
		if b.code == "" {
			mustOK(t, r, protocol.TypePush)
			continue
		}
		if r.Type != protocol.TypeError || r.Code != b.code {
			t.Errorf("%s: %s %s (%s), want error %s", b.name, r.Type, r.Code, r.Error, b.code)
		}
		mustOK(t, alice.call(protocol.Frame{Type: protocol.TypePing}), protocol.TypePong) // ten bad frames in a row close
	}
	f = mustOK(t, alice.call(protocol.Frame{Type: protocol.TypePushRemove, Push: &protocol.PushRegistration{Provider: protocol.PushFCM, Token: "b"}}), protocol.TypePush)
	if len(f.Registrations) != 3 {
		t.Fatalf("after removing one of 4: %v", regKeys(f))
	}

	// Bob registers alice's APNs token over /v1/rpc: it moves to him.
	rpc := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("bob")}
	do := func(f protocol.Frame) *protocol.Frame {
		t.Helper()
		body, _ := json.Marshal(f)
		st, out := rpc.do("POST", "/v1/rpc?device=ipad", body)
		if st != http.StatusOK {
			t.Fatalf("/v1/rpc %s: %d %s", f.Type, st, out)
		}
		if err := schema.ServerFrame(out); err != nil {
			t.Fatalf("/v1/rpc answer %s does not match protocol/schema/frames.json: %v", out, err)
		}
		var r protocol.Frame
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	f = mustOK(t, do(protocol.Frame{Type: protocol.TypePushRegister, Push: apns}), protocol.TypePush)
	if got := strings.Join(regKeys(f), " "); got != "apns:"+apns.Token {
		t.Fatalf("bob's registrations %s", got)
	}
	f = mustOK(t, alice.call(protocol.Frame{Type: protocol.TypePushRemove, Push: &protocol.PushRegistration{Provider: protocol.PushWebPush, Endpoint: "https://nowhere.example/x"}}), protocol.TypePush)
	if got := strings.Join(regKeys(f), " "); got != "fcm:fcm-token:APA91b webpush:https://push.example.net/send/abc" {
		t.Fatalf("alice after bob took her APNs token: %s", got)
	}
	// keys_remove drops the device, its push registrations with it.
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeKeysRemove}), protocol.TypeKeys)
	f = mustOK(t, alice.call(protocol.Frame{Type: protocol.TypePushRemove}), protocol.TypePush)
	if len(f.Registrations) != 0 {
		t.Fatalf("registrations after keys_remove: %v", regKeys(f))
	}
	if st, out := rpc.do("POST", "/v1/rpc?device=ipad", []byte(`{"type":"push_register","push":{"provider":"apns","token":"aa","topic":"t","sandbox":"yes"}}`)); st != http.StatusOK || !strings.Contains(string(out), `"code":"bad_frame"`) {
		t.Errorf("a registration with a field of the wrong type: %d %s", st, out)
	}
}

// TestHelloWebPushKey: with push.webpush set, hello announces the VAPID
// public key (the applicationServerKey a page subscribes with); without
// it, no key.
func TestHelloWebPushKey(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(k)
	file := filepath.Join(t.TempDir(), "vapid.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, _ := k.PublicKey.ECDH()
	want := base64.RawURLEncoding.EncodeToString(pub.Bytes())

	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Push.WebPush.VAPIDKeyFile, c.Push.WebPush.Subject = file, "mailto:ops@parley.example"
	}))
	if got := dialRaw(t, srv, "alice", "web").hello.WebPushKey; got != want {
		t.Errorf("hello webpush_key %q, want %q", got, want)
	}
	plain := servertest.Start(t)
	if got := dialRaw(t, plain, "alice", "web").hello.WebPushKey; got != "" {
		t.Errorf("hello of a node without Web Push: webpush_key %q", got)
	}
}
