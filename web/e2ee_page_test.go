package web_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/protocol"
)

// Browser tests of the page's end-to-end encrypted conversations: web
// users (the page's E2E module, keys in IndexedDB) with Go users of
// client/e2eechat (what the terminal CLI runs) on a real node.

const canary = "CANARY-7f3a9c-plaintext-must-never-reach-the-server"

// goPeer is a Go E2E user: a client and its Messenger.
type goPeer struct {
	t *testing.T
	c *client.Client
	m *e2eechat.Messenger
	d *e2ee.Device
}

// startGoPeer connects user/device and publishes its keys; account is the
// user's account key to import (nil: a new account).
func startGoPeer(t *testing.T, n *node, user, device string, account []byte) *goPeer {
	return startGoPeerKeys(t, n, user, device, account, 10)
}

// startGoPeerKeys is startGoPeer publishing keys keys (0: none yet).
func startGoPeerKeys(t *testing.T, n *node, user, device string, account []byte, keys int) *goPeer {
	t.Helper()
	c, err := client.New(client.Config{URL: n.srv.URL, Token: n.srv.Token(user), Device: device})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	go func() {
		for range c.Events() {
		}
	}()
	t.Cleanup(func() { cancel(); c.Close(); <-done })
	st := e2ee.NewMemoryStore()
	d, err := e2ee.OpenDevice(st, e2ee.Address{User: user, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	if account != nil {
		_, err = d.ImportAccountKey(account)
	} else {
		_, err = d.CreateAccountKey()
	}
	if err != nil {
		t.Fatal(err)
	}
	m := e2eechat.New(c, d, st)
	if keys == 0 {
		return &goPeer{t: t, c: c, m: m, d: d}
	}
	if _, err := m.PublishKeys(ctxT(t), keys); err != nil {
		t.Fatalf("publish keys of %s/%s: %v", user, device, err)
	}
	return &goPeer{t: t, c: c, m: m, d: d}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// conv finds the E2E conversation named name (a direct peer or a group name).
func (p *goPeer) conv(name string) uint64 {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		list, err := p.c.Conversations(ctxT(p.t))
		if err != nil {
			p.t.Fatal(err)
		}
		for _, s := range list {
			if s.E2E && (s.Peer == name || s.Name == name) {
				return s.ConvID
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.t.Fatalf("no E2E conversation %q", name)
	return 0
}

// texts opens conv's history: the shown texts by seq ("ERR: …" for what
// does not open).
func (p *goPeer) texts(conv uint64) map[uint64]string {
	p.t.Helper()
	msgs, _, err := p.c.History(ctxT(p.t), conv, client.HistoryQuery{Forward: true, Limit: 200})
	if err != nil {
		p.t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, msg := range msgs {
		o, err := p.m.Open(msg)
		if err != nil {
			out[msg.Seq] = "ERR: " + err.Error()
			continue
		}
		if msg.Kind == protocol.KindText && !o.Control && o.System == nil {
			out[msg.Seq] = o.Text
		}
	}
	return out
}

// waitText waits until conv shows text.
func (p *goPeer) waitText(conv uint64, text string) {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var got map[uint64]string
	for time.Now().Before(deadline) {
		got = p.texts(conv)
		for _, s := range got {
			if s == text {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.t.Fatalf("%s: no message %q in conv %d: %v", p.d.Address(), text, conv, got)
}

// e2eReady waits until the page has published its device's keys.
func (t *tab) e2eReady() {
	t.until("E2E device ready", `document.getElementById("e2e-status").textContent.startsWith("This browser is your device") && !document.getElementById("link-show").hidden`)
}

// openE2EDirect opens an encrypted direct chat with peer from the form.
func (t *tab) openE2EDirect(peer string) {
	t.run(chromedp.Click(chromedp.ID("e2e-direct")), chromedp.SendKeys(chromedp.ID("peer"), peer), chromedp.Click(chromedp.CSS("#new-direct button")))
	t.until("chat open", `!document.getElementById("chat").hidden && document.getElementById("title").textContent === `+js(peer))
	t.lockShown()
}

// lockShown: the lock and its label saying what the server sees.
func (t *tab) lockShown() {
	t.until("lock and label", `!document.getElementById("lock").hidden && /cannot read|not what is said/.test(document.getElementById("lock-label").textContent) && /server sees/.test(document.getElementById("lock-label").textContent)`)
}

// TestWebE2EEDirectWithGo: a web user opens an encrypted direct chat with
// a Go (CLI) user, from the form, with the lock and its label; messages go
// both ways; a reload keeps the device and its sessions (the kept
// messages show again, new ones go both ways); local search finds the
// decrypted text; the data directory holds no plaintext of the page's
// messages (while a plaintext conversation's control is found there).
func TestWebE2EEDirectWithGo(t *testing.T) {
	n := startNode(t)
	bob := startGoPeer(t, n, "bob", "cli", nil)
	b := newBrowser(t)
	alice := b.user("alice")
	alice.login(n, "alice")
	alice.e2eReady()
	alice.openE2EDirect("bob")
	alice.shot("encrypted chat open")
	alice.send(canary + " from the web")
	alice.waitBodies(canary + " from the web")
	conv := bob.conv("alice")
	bob.waitText(conv, canary+" from the web")
	if _, err := bob.m.SendDirect(ctxT(t), conv, "alice", canary+" from go"); err != nil {
		t.Fatal(err)
	}
	alice.waitBodies(canary+" from the web", canary+" from go")
	alice.shot("both ways")

	// A reload: the same device, its sessions and kept messages.
	alice.run(chromedp.Reload())
	alice.connected()
	alice.e2eReady()
	alice.until("conversation reopened", `document.getElementById("title").textContent === "bob"`)
	alice.waitBodies(canary+" from the web", canary+" from go")
	alice.send(canary + " after the reload")
	bob.waitText(conv, canary+" after the reload")
	if _, err := bob.m.SendDirect(ctxT(t), conv, "alice", canary+" to the reloaded page"); err != nil {
		t.Fatal(err)
	}
	alice.waitBodies(canary+" from the web", canary+" from go", canary+" after the reload", canary+" to the reloaded page")
	alice.shot("after reload")

	// Local search of the decrypted messages.
	alice.eval(`document.getElementById("e2e-panel").open = true`, new(bool))
	alice.run(chromedp.SendKeys(chromedp.ID("search-input"), "RELOADED PAGE"), chromedp.Click(chromedp.CSS("#search-form button")))
	alice.until("search hit", `[...document.querySelectorAll("#search-hits li")].map(l => l.textContent).join("|") === "bob: `+canary+` to the reloaded page"`)
	alice.shot("search")

	// A plaintext conversation's message is found by the scan below.
	alice.run(chromedp.SendKeys(chromedp.ID("peer"), "carol"), chromedp.Click(chromedp.CSS("#new-direct button")))
	alice.until("plain chat open", `document.getElementById("title").textContent === "carol" && document.getElementById("lock").hidden`)
	alice.send(control)
	alice.waitBodies(control)
	b.mu.Lock()
	b.allowNetErrors = true // the page reconnecting to the closed node
	b.mu.Unlock()
	n.srv.Close()
	assertNoCanary(t, n.dir)
}

// control is sent in clear in a plaintext conversation: the scan must find
// it, or it could not find the canary either (compression, a wrong dir).
const control = "CONTROL-5e1d0b-plaintext-in-a-plaintext-conversation"

func assertNoCanary(t *testing.T, dir string) {
	t.Helper()
	files, control_ := 0, false
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		if bytes.Contains(b, []byte("CANARY-7f3a9c")) {
			t.Errorf("plaintext canary in %s", p)
		}
		if bytes.Contains(b, []byte(control)) {
			control_ = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 || !control_ {
		t.Fatalf("the scan of %s (%d files) does not find the plaintext control: it could not find plaintext", dir, files)
	}
}

// TestWebE2EEGroupWithGo: an encrypted group created on the page with
// two web users and two Go users: messages from each side reach all;
// the owner removes a member on the page, and the removed member's device
// cannot open what is sent after (the sender keys were rotated), while
// the others read it.
func TestWebE2EEGroupWithGo(t *testing.T) {
	n := startNode(t)
	carol := startGoPeer(t, n, "carol", "cli", nil)
	dave := startGoPeer(t, n, "dave", "cli", nil)
	b := newBrowser(t)
	alice, bob := b.user("alice"), b.user("bob")
	alice.login(n, "alice")
	bob.login(n, "bob")
	alice.e2eReady()
	bob.e2eReady()
	alice.run(chromedp.Click(chromedp.ID("e2e-group")), chromedp.SendKeys(chromedp.ID("group-name"), "vault"),
		chromedp.SendKeys(chromedp.ID("group-members"), "bob, carol, dave"), chromedp.Click(chromedp.CSS("#new-group button")))
	alice.until("group open", `document.getElementById("title").textContent === "# vault"`)
	alice.lockShown()
	alice.send(canary + " alice to the group")
	alice.waitBodies(canary + " alice to the group")
	conv := carol.conv("vault")
	carol.waitText(conv, canary+" alice to the group")
	dave.waitText(conv, canary+" alice to the group")
	members := []string{"alice", "bob", "carol", "dave"}
	if _, err := carol.m.SendGroup(ctxT(t), conv, members, canary+" carol from go"); err != nil {
		t.Fatal(err)
	}
	bob.openConv("vault")
	bob.lockShown()
	bob.waitBodies(canary+" alice to the group", canary+" carol from go")
	bob.send(canary + " bob from the web")
	for _, tb := range []*tab{alice, bob} {
		tb.waitBodies(canary+" alice to the group", canary+" carol from go", canary+" bob from the web")
		tb.shot("group")
	}
	carol.waitText(conv, canary+" bob from the web")
	dave.waitText(conv, canary+" bob from the web")

	// alice removes dave on the page; what follows is not for dave's keys.
	alice.run(chromedp.SendKeys(chromedp.ID("remove-input"), "dave"), chromedp.Click(chromedp.CSS("#remove-members button")))
	alice.until("dave removed", `[...document.querySelectorAll("#messages li.system")].some(e => e.textContent === "alice removed dave")`)
	bob.until("dave removed", `[...document.querySelectorAll("#messages li.system")].some(e => e.textContent === "alice removed dave")`)
	alice.send(canary + " after dave left")
	bob.send(canary + " bob after dave left")
	members = []string{"alice", "bob", "carol"}
	carol.waitText(conv, canary+" after dave left")
	carol.waitText(conv, canary+" bob after dave left")
	if _, err := carol.m.SendGroup(ctxT(t), conv, members, canary+" carol after dave left"); err != nil {
		t.Fatal(err)
	}
	for _, tb := range []*tab{alice, bob} {
		tb.waitBodies(canary+" alice to the group", canary+" carol from go", canary+" bob from the web",
			canary+" after dave left", canary+" bob after dave left", canary+" carol after dave left")
		tb.shot("after the removal")
	}
	// dave's device, handed the new ciphertexts (as a server keeping him in
	// the fan-out would), opens none of them.
	msgs, _, err := carol.c.History(ctxT(t), conv, client.HistoryQuery{Forward: true, Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	after, removedAt := 0, uint64(0)
	for _, m := range msgs {
		if m.Kind == protocol.KindSystem && strings.Contains(m.Body, "member_removed") {
			removedAt = m.Seq
		}
		if removedAt == 0 || m.Seq <= removedAt || m.Kind != protocol.KindText {
			continue
		}
		o, err := dave.m.Open(m)
		if err == nil && !o.Control && o.Text != "" {
			t.Fatalf("the removed member read seq %d: %q", m.Seq, o.Text)
		}
		if err == nil && !o.Control {
			t.Fatalf("the removed member opened seq %d: %+v", m.Seq, o)
		}
		if err != nil {
			after++
		}
	}
	if removedAt == 0 || after < 3 {
		t.Fatalf("removal at seq %d, %d messages after it refused to dave", removedAt, after)
	}
	b.mu.Lock()
	b.allowNetErrors = true
	b.mu.Unlock()
	n.srv.Close()
	assertNoCanaryAny(t, n.dir)
}

// assertNoCanaryAny is assertNoCanary without the control (a test that
// sent none; TestWebE2EEDirectWithGo shows the scan finds plaintext).
func assertNoCanaryAny(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("CANARY-7f3a9c")) {
				t.Errorf("plaintext canary in %s", p)
			}
		}
		return nil
	})
}

// TestWebE2EETwoDevices: a second browser profile of the same user is
// linked with the code the first one shows; both read what the Go peer
// sends and what each other sends; the older messages, from before the
// second device existed, show there as "not on this device".
func TestWebE2EETwoDevices(t *testing.T) {
	n := startNode(t)
	bob := startGoPeer(t, n, "bob", "cli", nil)
	b := newBrowser(t)
	laptop := b.user("alice laptop")
	laptop.login(n, "alice")
	laptop.e2eReady()
	laptop.openE2EDirect("bob")
	laptop.send(canary + " before the phone")
	conv := bob.conv("alice")
	bob.waitText(conv, canary+" before the phone")

	phone := b.user("alice phone")
	phone.login(n, "alice")
	phone.until("link asked", `!document.getElementById("link-form").hidden && document.getElementById("e2e-panel").open`)
	phone.shot("link asked")
	laptop.eval(`document.getElementById("e2e-panel").open = true`, new(bool))
	laptop.run(chromedp.Click(chromedp.ID("link-show")))
	laptop.until("link code", `document.getElementById("link-code").value.startsWith("parley-account-key-v1 ")`)
	var code string
	laptop.eval(`document.getElementById("link-code").value`, &code)
	phone.eval(`document.getElementById("link-input").value = `+js(code)+`, true`, new(bool))
	phone.run(chromedp.Click(chromedp.CSS("#link-form button")))
	phone.e2eReady()
	phone.shot("linked")

	if _, err := bob.m.SendDirect(ctxT(t), conv, "alice", canary+" to both devices"); err != nil {
		t.Fatal(err)
	}
	laptop.waitBodies(canary+" before the phone", canary+" to both devices")
	phone.openConv("bob")
	phone.lockShown()
	phone.until("older message not on this device", `(() => { const b = [...document.querySelectorAll("#messages li:not(.system) .body")]; return b.length === 2 && b[0].classList.contains("missing") && /Not on this device/.test(b[0].textContent) && b[1].textContent === `+js(canary+" to both devices")+` })()`)
	phone.send(canary + " from the phone")
	laptop.waitBodies(canary+" before the phone", canary+" to both devices", canary+" from the phone")
	bob.waitText(conv, canary+" from the phone")
	laptop.send(canary + " from the laptop")
	phone.until("the laptop's message", `[...document.querySelectorAll("#messages li:not(.system):not(.pending) .body")].map(e => e.textContent).pop() === `+js(canary+" from the laptop"))
	bob.waitText(conv, canary+" from the laptop")
	phone.shot("two devices")
	laptop.shot("two devices")
}

// TestWebE2EESafetyNumber: the safety number view shows the number the Go
// peer computes, in groups of digits, with a QR code of it; when the peer
// starts over under a new account key, the page shows a banner naming
// them and the view shows the new number.
func TestWebE2EESafetyNumber(t *testing.T) {
	n := startNode(t)
	bob := startGoPeer(t, n, "bob", "cli", nil)
	b := newBrowser(t)
	alice := b.user("alice")
	alice.login(n, "alice")
	alice.e2eReady()
	alice.openE2EDirect("bob")
	alice.send("hello bob")
	conv := bob.conv("alice")
	bob.waitText(conv, "hello bob")
	want, err := bob.m.SafetyNumber(ctxT(t), "alice")
	if err != nil || len(want) != 60 {
		t.Fatalf("safety number %q %v", want, err)
	}
	alice.run(chromedp.Click(chromedp.ID("safety")))
	alice.until("safety number shown", `document.getElementById("safety-number").dataset.number === `+js(want)+` && document.getElementById("safety-number").textContent.split(String.fromCharCode(10)).length === 3 && !!document.querySelector("#safety-qr svg")`)
	alice.shot("safety number")
	alice.run(chromedp.Click(chromedp.ID("safety-close")))

	// bob sets up encryption again under a new account key.
	bob2 := startGoPeerKeys(t, n, "bob", "new-phone", nil, 0)
	if err := bob2.m.ReplaceAccount(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := bob2.m.PublishKeys(ctxT(t), 5); err != nil {
		t.Fatal(err)
	}
	if _, err := bob2.m.SendDirect(ctxT(t), conv, "alice", "bob again"); err != nil {
		t.Fatal(err)
	}
	alice.until("identity banner", `!document.getElementById("identity-banner").hidden && document.getElementById("identity-text").textContent.includes("bob's safety number changed")`)
	alice.waitBodies("hello bob", "bob again")
	alice.shot("identity changed")
	now, err := bob2.m.SafetyNumber(ctxT(t), "alice")
	if err != nil || now == want {
		t.Fatalf("new safety number %q (old %q) %v", now, want, err)
	}
	alice.run(chromedp.Click(chromedp.ID("identity-show")))
	alice.until("new safety number", `document.getElementById("safety-number").dataset.number === `+js(now))
	alice.shot("new safety number")
}

// TestWebE2EESecondTab: a second tab of the same browser profile does not
// touch the device's keys while the first holds them (it runs as a plain
// device and says so, and an encrypted conversation there shows
// placeholders, never the envelope); when the first tab closes, the second
// takes the device over and reads the conversation.
func TestWebE2EESecondTab(t *testing.T) {
	n := startNode(t)
	bob := startGoPeer(t, n, "bob", "cli", nil)
	b := newBrowser(t)
	holder := b.user("holder")
	first, second := holder.another("alice tab 1"), holder.another("alice tab 2")
	first.login(n, "alice")
	first.e2eReady()
	first.openE2EDirect("bob")
	first.send("one")
	conv := bob.conv("alice")
	bob.waitText(conv, "one")
	if _, err := bob.m.SendDirect(ctxT(t), conv, "alice", "two"); err != nil {
		t.Fatal(err)
	}
	first.waitBodies("one", "two")
	second.login(n, "alice")
	second.until("E2E off in this tab", `/another tab of this browser holds this device's keys/.test(document.getElementById("e2e-status").textContent)`)
	second.openConv("bob")
	second.until("placeholders", `(() => { const b = [...document.querySelectorAll("#messages li:not(.system) .body")]; return b.length === 2 && b.every(e => e.classList.contains("missing") && /tab that holds/.test(e.textContent)) })()`)
	var text string
	second.eval(`document.getElementById("messages").textContent`, &text)
	if strings.Contains(text, `"e2e"`) {
		t.Fatalf("the envelope shows: %q", text)
	}
	second.shot("second tab")
	closeTab(t, first)
	second.e2eReady()
	second.openConv("bob")
	second.waitBodies("one", "two")
	second.send("three")
	bob.waitText(conv, "three")
	second.shot("took over")
}
