package web_test

// Web Push on the page, in a real Chromium against a real node whose
// pusher sends to a local push service (TLS, as every Web Push endpoint
// is). Chromium's own push service (Google's) is out of reach here, so
// pushManager.subscribe cannot succeed: the test registers a subscription
// whose keys it holds, takes the request the pusher really sends, decrypts
// it (RFC 8291) and hands the plaintext to the page's service worker with
// CDP ServiceWorker.deliverPushMessage — the step the browser's push
// service would do.

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/serviceworker"
	"github.com/chromedp/chromedp"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/push"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
)

// pushService is a local Web Push service: it holds the subscriptions'
// private keys (a browser's part) and hands over each message the pusher
// posts, decrypted.
type pushService struct {
	t   *testing.T
	srv *httptest.Server
	mu  sync.Mutex
	sub map[string]subscriptionKeys // endpoint path → keys
	got chan pushed
}

type subscriptionKeys struct {
	priv *ecdh.PrivateKey
	auth []byte
}

// pushed is one message as the browser would get it.
type pushed struct {
	path      string
	topic     string
	plaintext string
}

func newPushService(t *testing.T) *pushService {
	ps := &pushService{t: t, sub: map[string]subscriptionKeys{}, got: make(chan pushed, 16)}
	ps.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ps.mu.Lock()
		k, ok := ps.sub[r.URL.Path]
		ps.mu.Unlock()
		if !ok || r.Header.Get("Content-Encoding") != "aes128gcm" || !strings.HasPrefix(r.Header.Get("Authorization"), "vapid ") {
			t.Errorf("push service: %s %s with %v", r.Method, r.URL.Path, r.Header)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		pt, err := decryptWebPush(k.priv, k.auth, body)
		if err != nil {
			t.Errorf("push service: %s: %v", r.URL.Path, err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ps.got <- pushed{path: r.URL.Path, topic: r.Header.Get("Topic"), plaintext: string(pt)}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(ps.srv.Close)
	return ps
}

// subscribe makes a subscription as a browser would: the push_register
// fields of a fresh key pair and auth secret at a new endpoint.
func (ps *pushService) subscribe(name string) (endpoint, p256dh, auth string) {
	k, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		ps.t.Fatal(err)
	}
	a := make([]byte, 16)
	_, _ = rand.Read(a)
	path := "/wp/" + name
	ps.mu.Lock()
	ps.sub[path] = subscriptionKeys{priv: k, auth: a}
	ps.mu.Unlock()
	enc := base64.RawURLEncoding.EncodeToString
	return ps.srv.URL + path, enc(k.PublicKey().Bytes()), enc(a)
}

// next waits for the pusher's next message.
func (ps *pushService) next() pushed {
	ps.t.Helper()
	select {
	case p := <-ps.got:
		return p
	case <-time.After(30 * time.Second):
		ps.t.Fatal("no Web Push within 30 s")
		return pushed{}
	}
}

// decryptWebPush opens an aes128gcm message (RFC 8188 header, one record)
// with the subscription's private key and auth secret (RFC 8291 §3.4).
func decryptWebPush(ua *ecdh.PrivateKey, auth, msg []byte) ([]byte, error) {
	if len(msg) < 21 || len(msg) < 21+int(msg[20]) {
		return nil, fmt.Errorf("a message of %d bytes has no header", len(msg))
	}
	salt, rs, idLen := msg[:16], binary.BigEndian.Uint32(msg[16:20]), int(msg[20])
	asPublic, record := msg[21:21+idLen], msg[21+idLen:]
	if rs < 18 || len(record) > int(rs) {
		return nil, fmt.Errorf("record size %d, record %d bytes", rs, len(record))
	}
	as, err := ecdh.P256().NewPublicKey(asPublic)
	if err != nil {
		return nil, err
	}
	shared, err := ua.ECDH(as)
	if err != nil {
		return nil, err
	}
	info := append(append([]byte("WebPush: info\x00"), ua.PublicKey().Bytes()...), asPublic...)
	ikm, err := hkdf.Key(sha256.New, shared, auth, string(info), 32)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Key(sha256.New, ikm, salt, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Key(sha256.New, ikm, salt, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	pt, err := gcm.Open(nil, nonce, record, nil)
	if err != nil {
		return nil, err
	}
	end := strings.LastIndexByte(string(pt), 2) // the last record's delimiter, then padding zeros
	if end < 0 || strings.Trim(string(pt[end+1:]), "\x00") != "" {
		return nil, fmt.Errorf("no last-record delimiter")
	}
	return pt[:end], nil
}

func writeVAPIDKey(t *testing.T) string {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(k)
	file := filepath.Join(t.TempDir(), "vapid.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// pushSpy counts the page's calls of Notification.requestPermission and
// PushManager.subscribe, passing each through unchanged.
const pushSpy = `window.__push = {permission: 0, subscribe: 0};
if (window.Notification) {
  const rp = Notification.requestPermission.bind(Notification);
  Notification.requestPermission = (...a) => { window.__push.permission++; return rp(...a); };
}
if (window.PushManager) {
  const s = PushManager.prototype.subscribe;
  PushManager.prototype.subscribe = function (...a) { window.__push.subscribe++; return s.apply(this, a); };
}`

func (t *tab) spyPush() {
	t.b.t.Helper()
	if _, err := chromedp.Call(t.ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: pushSpy}); err != nil {
		t.b.t.Fatalf("%s: add script: %v", t.name, err)
	}
}

// setNotifications answers the notification permission for the node's
// origin in t's browser context as a user would in the prompt.
func (t *tab) setNotifications(n *node, setting cdpbrowser.PermissionSetting) {
	t.b.t.Helper()
	_, err := chromedp.CallBrowser(t.ctx, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
		Permission: &cdpbrowser.PermissionDescriptor{Name: "notifications"}, Setting: setting,
		Origin: strings.TrimSuffix(n.url(), "/"), BrowserContextID: chromedp.FromContext(t.ctx).BrowserContextID,
	})
	if err != nil {
		t.b.t.Fatalf("%s: set permission: %v", t.name, err)
	}
}

// workerRegistration is the CDP id of the origin's service worker registration.
func (t *tab) workerRegistration(n *node) serviceworker.RegistrationID {
	t.b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, 30*time.Second)
	defer cancel()
	found := make(chan serviceworker.RegistrationID, 1)
	err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*serviceworker.EventWorkerRegistrationUpdated); ok {
			for _, r := range e.Registrations {
				if r.ScopeURL == n.url() && !r.IsDeleted {
					select {
					case found <- r.RegistrationID:
					default:
					}
				}
			}
		}
	})
	if err == nil {
		_, err = chromedp.Call(ctx, serviceworker.Enable, cdp.Empty{})
	}
	if err != nil {
		t.b.t.Fatalf("%s: service worker domain: %v", t.name, err)
	}
	select {
	case id := <-found:
		return id
	case <-ctx.Done():
		t.b.t.Fatalf("%s: no service worker registration for %s", t.name, n.url())
		return ""
	}
}

// deliver hands a push message's data to the worker, as the browser does
// when its push service delivers one.
func (t *tab) deliver(n *node, id serviceworker.RegistrationID, data string) {
	t.b.t.Helper()
	_, err := chromedp.Call(t.ctx, serviceworker.DeliverPushMessage, serviceworker.DeliverPushMessageParams{
		Origin: strings.TrimSuffix(n.url(), "/"), RegistrationID: id, Data: data,
	})
	if err != nil {
		t.b.t.Fatalf("%s: deliver push message: %v", t.name, err)
	}
}

type shownNotification struct{ Title, Body, Tag string }

// notifications are those the worker shows, by tag.
func (t *tab) notifications() map[string]shownNotification {
	var list []shownNotification
	t.evalAsync(`navigator.serviceWorker.getRegistration("/").then(r => r.getNotifications()).then(ns => ns.map(n => ({title: n.title, body: n.body, tag: n.tag})))`, &list)
	out := map[string]shownNotification{}
	for _, n := range list {
		out[n.Tag] = n
	}
	return out
}

func (t *tab) waitNotification(tag string, want shownNotification) {
	t.b.t.Helper()
	t.untilAsync("notification "+tag, fmt.Sprintf(`(async () => { const r = await navigator.serviceWorker.getRegistration("/");
		const n = (await r.getNotifications()).find(n => n.tag === %q); return !!n && n.title === %q && n.body === %q })()`, tag, want.Title, want.Body))
}

// untilAsync is until for an expression that yields a promise.
func (t *tab) untilAsync(what, expr string) {
	t.b.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.ctx, 10*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr, chromedp.EvalAwaitPromise))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.shot("timeout")
			t.b.t.Fatalf("%s: waiting for %s: %v", t.name, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rpcAs posts one frame over /v1/rpc as user on device and decodes the answer.
func rpcAs(t *testing.T, n *node, user, device, frame string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, n.srv.HTTPURL+"/v1/rpc?device="+device, strings.NewReader(frame))
	req.Header.Set("Authorization", "Bearer "+n.srv.Token(user))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out["type"] == "error" {
		t.Fatalf("rpc %s: %d %v %v", frame, resp.StatusCode, out, err)
	}
	return out
}

// registrations of user's device: push_remove of an endpoint the device
// does not hold changes nothing and answers them.
func registrations(t *testing.T, n *node, user, device string) []string {
	t.Helper()
	f := rpcAs(t, n, user, device, `{"type":"push_remove","push":{"provider":"webpush","endpoint":"https://push.invalid/none"}}`)
	var out []string
	regs, _ := f["registrations"].([]any)
	for _, r := range regs {
		out = append(out, r.(map[string]any)["endpoint"].(string))
	}
	return out
}

func collapseTag(t *testing.T, conv string) string {
	id, err := strconv.ParseUint(conv, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return "c" + strconv.FormatUint(id, 36)
}

// tabDevice is the device id the page connected as (its E2E device's when
// the tab holds it, else the tab's own).
const tabDevice = `sessionStorage.getItem("parley.device") ?? localStorage.getItem("parley.e2ee.device." + document.getElementById("me").textContent)`

// TestWebPushNotifications: nothing is asked when the page loads; a click
// on "Enable notifications" asks for the permission (a refusal says how to
// allow it), then registers the service worker and subscribes — which
// fails here (a private window: no push service) with a message saying
// so. The pusher's Web Push for a message while no tab of the user is
// open, delivered to the worker, shows the sender and the text under the
// conversation's collapse tag, a newer one replacing it; an end-to-end
// encrypted conversation's shows no content. A tab opened at
// /#conv=<id> (where a click on a notification leads) opens that
// conversation, and signing out removes the device's registrations.
func TestWebPushNotifications(t *testing.T) {
	ps := newPushService(t)
	vapid := writeVAPIDKey(t)
	n := startNodeWith(t, []servertest.Option{servertest.WithDeps(func(d *server.Deps) { d.PushClient = ps.srv.Client() })}, func(c *config.Config) {
		c.Push.Preview = push.PreviewFull
		c.Push.Burst = 20 * time.Millisecond
		c.Push.WebPush = push.WebPushConfig{VAPIDKeyFile: vapid, Subject: "mailto:ops@parley.example"}
	})
	// No back-forward cache: a page navigated away from closes its connection.
	b := newBrowser(t, chromedp.Flag("disable-features", "Translate,BlinkGenPropertyTrees,BackForwardCache"))
	// Chromium logs that it has no Push API in a private browser context.
	b.tolerate = regexp.MustCompile(`does not support the Push API in incognito mode`)
	alice := b.user("alice")
	alice.spyPush()
	alice.login(n, "alice")
	alice.until("notification control", `!document.getElementById("notify-panel").hidden`)

	type state struct {
		Permission, Subscribe int
		State                 string
		Worker                bool
	}
	now := func() state {
		var s state
		alice.evalAsync(`(async () => ({permission: __push.permission, subscribe: __push.subscribe,
			state: (await navigator.permissions.query({name: "notifications"})).state,
			worker: !!(await navigator.serviceWorker.getRegistration("/"))}))()`, &s)
		return s
	}
	if s := now(); s != (state{State: "prompt"}) {
		t.Fatalf("after the page loaded: %+v, want no permission asked, no subscription, no worker", s)
	}
	alice.shot("signed in, nothing asked")

	// The user refuses in the prompt.
	alice.setNotifications(n, cdpbrowser.PermissionSettingDenied)
	alice.run(chromedp.Click(chromedp.ID("notify")))
	alice.until("refusal explained", `document.getElementById("notify-note").textContent.includes("blocked for this site")`)
	if s := now(); s.Permission != 1 || s.Subscribe != 0 || s.Worker {
		t.Fatalf("after a refusal: %+v, want one request, no subscription, no worker", s)
	}
	alice.shot("denied")

	// The user allows: the worker is registered, the subscription fails.
	alice.setNotifications(n, cdpbrowser.PermissionSettingGranted)
	alice.run(chromedp.Click(chromedp.ID("notify")))
	alice.until("no push service explained", `document.getElementById("notify-note").textContent.includes("push service is not available")`)
	if s := now(); s.Permission != 2 || s.Subscribe != 1 || !s.Worker || s.State != "granted" {
		t.Fatalf("after allowing: %+v, want a second request, one subscribe, the worker", s)
	}
	alice.shot("no push service")

	// A subscription of alice's device on the local push service; then
	// her tab goes and another tab of the browser stays on the sign-in.
	var device string
	alice.eval(tabDevice, &device)
	endpoint, p256dh, auth := ps.subscribe("alice")
	rpcAs(t, n, "alice", device, fmt.Sprintf(`{"type":"push_register","push":{"provider":"webpush","endpoint":%q,"p256dh":%q,"auth":%q}}`, endpoint, p256dh, auth))
	conv := rpcAs(t, n, "bob", "script", `{"type":"open_direct","peer":"alice"}`)["conv"].(map[string]any)["conv_id"].(string)
	later := alice.another("alice, later")
	later.run(chromedp.Navigate(n.url()), chromedp.WaitVisible(chromedp.ID("login-name")))
	reg := later.workerRegistration(n)
	alice.run(chromedp.Navigate("about:blank"))
	for {
		st := rpcAs(t, n, "bob", "script", `{"type":"presence_sub","users":["alice"]}`)["states"].([]any)
		if online, _ := st[0].(map[string]any)["online"].(bool); !online {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	tag := collapseTag(t, conv)
	rpcAs(t, n, "bob", "script", fmt.Sprintf(`{"type":"send","conv_id":%q,"client_msg_id":"m1","body":"lunch at noon?"}`, conv))
	p := ps.next()
	var payload map[string]any
	if err := json.Unmarshal([]byte(p.plaintext), &payload); err != nil || payload["title"] != "bob" || payload["body"] != "lunch at noon?" || payload["conv_id"] != conv || p.topic != tag {
		t.Fatalf("the pusher sent %s (Topic %s), want bob's text in conversation %s under Topic %s", p.plaintext, p.topic, conv, tag)
	}
	later.deliver(n, reg, p.plaintext)
	later.waitNotification(tag, shownNotification{Title: "bob", Body: "lunch at noon?"})
	later.shot("notification shown")

	// A newer message of the conversation replaces it.
	rpcAs(t, n, "bob", "script", fmt.Sprintf(`{"type":"send","conv_id":%q,"client_msg_id":"m2","body":"or at one"}`, conv))
	p = ps.next()
	payload = nil
	if err := json.Unmarshal([]byte(p.plaintext), &payload); err != nil || !strings.HasPrefix(fmt.Sprint(payload["body"]), "or at one") {
		t.Fatalf("the pusher sent %s for the second message", p.plaintext)
	}
	later.deliver(n, reg, p.plaintext)
	later.waitNotification(tag, shownNotification{Title: "bob", Body: payload["body"].(string)})
	if got := later.notifications(); len(got) != 1 {
		t.Fatalf("notifications %+v, want the conversation's one", got)
	}

	// An end-to-end encrypted conversation: no sender, no text.
	e2eConv := rpcAs(t, n, "bob", "script", `{"type":"open_direct","peer":"alice","e2e":true}`)["conv"].(map[string]any)["conv_id"].(string)
	envelope := `{"e2e":1,"to":[{"user":"alice","device":"` + device + `","type":3,"body":"c2VjcmV0IHBsYW5z"}]}`
	rpcAs(t, n, "bob", "script", fmt.Sprintf(`{"type":"send","conv_id":%q,"client_msg_id":"e1","body":%q}`, e2eConv, envelope))
	p = ps.next()
	payload = nil
	if err := json.Unmarshal([]byte(p.plaintext), &payload); err != nil || payload["e2e"] != true || payload["title"] != nil || payload["body"] != nil {
		t.Fatalf("the pusher sent %s for an E2E conversation, want e2e and no title or body", p.plaintext)
	}
	e2eTag := collapseTag(t, e2eConv)
	later.deliver(n, reg, p.plaintext)
	later.waitNotification(e2eTag, shownNotification{Title: "Parley", Body: "New encrypted message"})
	if got := later.notifications()[e2eTag]; strings.Contains(got.Title+got.Body, "bob") || strings.Contains(got.Title+got.Body, "c2VjcmV0") {
		t.Fatalf("E2E notification %+v shows content", got)
	}
	later.shot("encrypted notification")

	// Where a notification's click leads: the page at that conversation.
	later.run(chromedp.Navigate("about:blank"), chromedp.Navigate(n.url()+"#conv="+conv), chromedp.WaitVisible(chromedp.ID("login-name")))
	later.run(chromedp.SendKeys(chromedp.ID("login-name"), "alice"), chromedp.Click(chromedp.CSS("#login-form button")))
	later.connected()
	later.until("the notification's conversation open", `!document.getElementById("chat").hidden && document.getElementById("title").textContent === "bob"`)
	later.waitBodies("lunch at noon?", "or at one")
	later.shot("opened at the conversation")

	// Signing out removes this device's registrations.
	var device2 string
	later.eval(tabDevice, &device2)
	endpoint2, p256dh2, auth2 := ps.subscribe("alice-later")
	rpcAs(t, n, "alice", device2, fmt.Sprintf(`{"type":"push_register","push":{"provider":"webpush","endpoint":%q,"p256dh":%q,"auth":%q}}`, endpoint2, p256dh2, auth2))
	if got := registrations(t, n, "alice", device2); !slices.Contains(got, endpoint2) {
		t.Fatalf("registrations of %s before signing out: %v", device2, got)
	}
	later.run(chromedp.Click(chromedp.ID("signout")))
	later.until("signed out", `!document.getElementById("login").hidden`)
	if got := registrations(t, n, "alice", device2); len(got) != 0 {
		t.Fatalf("registrations of %s after signing out: %v", device2, got)
	}
	later.shot("signed out")
}

// TestWebPushServiceSilent: in a normal (not private) profile Chromium's
// subscribe waits for its push service, which is out of reach here and
// never answers; the page gives up after its 20 s and says so, and
// notifications stay off.
func TestWebPushServiceSilent(t *testing.T) {
	n := startNode(t, func(c *config.Config) {
		c.Push.WebPush = push.WebPushConfig{VAPIDKeyFile: writeVAPIDKey(t), Subject: "mailto:ops@parley.example"}
	})
	b := newBrowser(t)
	ctx, _ := chromedp.NewContext(b.ctx) // a tab of the browser's own profile
	alice := b.attach(ctx, "alice")
	alice.login(n, "alice")
	alice.until("notification control", `!document.getElementById("notify-panel").hidden`)
	alice.setNotifications(n, cdpbrowser.PermissionSettingGranted)
	alice.run(chromedp.Click(chromedp.ID("notify")))
	alice.until("subscribing", `document.getElementById("notify-note").textContent.startsWith("Subscribing")`)
	deadline := time.Now().Add(90 * time.Second) // the page's 20 s, on a loaded machine
	for {
		var note string
		alice.eval(`document.getElementById("notify-note").textContent`, &note)
		if strings.Contains(note, "push service is not available (no answer within 20 s)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("note %q, want the push service's silence explained", note)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var on string
	alice.eval(`document.getElementById("notify").textContent + "/" + document.getElementById("notify").disabled`, &on)
	if on != "Enable notifications/false" {
		t.Fatalf("control %q after the failure, want Enable notifications, enabled", on)
	}
	alice.shot("push service silent")
}
