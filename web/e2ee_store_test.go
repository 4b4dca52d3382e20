package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser tests of the page's E2E module (web/static/js/e2ee.js) on its
// own: the IndexedDB store and the Web Lock, in the real Chromium.

// e2eeModule is a page expression that imports the page's E2E module.
const e2eeModule = `import("/web/js/e2ee.js")`

// TestWebE2EEStore: IDBStore keeps values, lists by prefix and deletes;
// at rest the values are sealed (no plaintext in IndexedDB) under a key
// that no script can export; a value moved under another name does not
// open; a closed database reopens with the same contents.
func TestWebE2EEStore(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	tb := b.user("store")
	tb.run(chromedp.Navigate(n.url()), chromedp.WaitVisible(chromedp.ID("login-name")))
	var got struct {
		A, B, Gone, Reopened string
		List                 []string
		Sealed, Extractable  bool
		Moved                string
	}
	tb.evalAsync(`(async () => {
		const e = await `+e2eeModule+`;
		const st = await e.IDBStore.open("t1");
		await st.batch([{ key: "session/bob/b", value: e.utf8("SECRET-a") }, { key: "session/bob/c", value: e.utf8("SECRET-b") }, { key: "other/x", value: e.utf8("x") }]);
		await st.batch([{ key: "other/x", value: null }]);
		const dec = (v) => v ? e.fromUtf8(v) : "";
		const r = { A: dec(await st.load("session/bob/b")), B: dec(await st.load("session/bob/c")), Gone: dec(await st.load("other/x")), List: await st.list("session/") };
		await st.close();
		// The raw database: sealed values, a non-extractable key.
		const db = await new Promise((res, rej) => { const q = indexedDB.open("t1"); q.onsuccess = () => res(q.result); q.onerror = () => rej(q.error); });
		const get = (store, k) => new Promise((res, rej) => { const q = db.transaction(store).objectStore(store).get(k); q.onsuccess = () => res(q.result); q.onerror = () => rej(q.error); });
		const raw = await get("values", "session/bob/b");
		r.Sealed = !new TextDecoder("latin1").decode(raw).includes("SECRET");
		const key = await get("meta", "seal");
		r.Extractable = key.extractable;
		try { await crypto.subtle.exportKey("raw", key); r.Extractable = true } catch {}
		// A value copied under another name does not open.
		await new Promise((res, rej) => { const tx = db.transaction("values", "readwrite"); tx.objectStore("values").put(raw, "session/eve/e"); tx.oncomplete = res; tx.onerror = () => rej(tx.error); });
		db.close();
		const st2 = await e.IDBStore.open("t1");
		r.Reopened = dec(await st2.load("session/bob/b"));
		try { await st2.load("session/eve/e"); r.Moved = "opened" } catch (err) { r.Moved = err.name }
		await st2.close();
		return r;
	})()`, &got)
	if got.A != "SECRET-a" || got.B != "SECRET-b" || got.Gone != "" || got.Reopened != "SECRET-a" {
		t.Fatalf("store contents: %+v", got)
	}
	if strings.Join(got.List, ",") != "session/bob/b,session/bob/c" {
		t.Fatalf("list: %v", got.List)
	}
	if !got.Sealed || got.Extractable {
		t.Fatalf("at rest: sealed %v, key extractable %v", got.Sealed, got.Extractable)
	}
	if got.Moved != "OperationError" {
		t.Fatalf("a value under another name: %s", got.Moved)
	}
}

// TestWebE2EEClosedTab: a tab closed while its device encrypts, message
// after message into IndexedDB, leaves no half-advanced ratchet: a new
// tab of the same profile opens the device, the peer opens every
// ciphertext the dead tab handed out (in reverse order), and both go on
// both ways. Each encryption is one IndexedDB transaction.
func TestWebE2EEClosedTab(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	// Tabs of one profile opened from a holder tab: closing one (its own
	// context) leaves the others.
	holder := b.user("holder")
	first := holder.another("tab 1")
	second := holder.another("tab 2")
	first.run(chromedp.Navigate(n.url()), chromedp.WaitVisible(chromedp.ID("login-name")))
	second.run(chromedp.Navigate(n.url()), chromedp.WaitVisible(chromedp.ID("login-name")))
	for round := 0; round < 3; round++ {
		// The writer: alice (and, the first time, bob) from IndexedDB.
		writer := first
		if round > 0 {
			writer = holder.another(fmt.Sprintf("writer %d", round))
			writer.run(chromedp.Navigate(n.url()), chromedp.WaitVisible(chromedp.ID("login-name")))
		}
		var ok bool
		writer.evalAsync(`(async () => {
			const e = await `+e2eeModule+`;
			const A = { user: "alice", device: "a" }, B = { user: "bob", device: "b" };
			const alice = await e.Device.open(await e.IDBStore.open("alice"), A);
			if (`+map[bool]string{true: "true", false: "false"}[round == 0]+`) {
				const bob = await e.Device.open(await e.IDBStore.open("bob"), B);
				const up = await bob.generateKeys(1);
				await alice.processBundle({ ...B, registrationId: up.registrationId, identityKey: up.identityKey, signedPreKey: up.signedPreKey, preKey: up.preKeys[0], kemPreKey: up.kemPreKeys[0] });
				const c = await alice.encrypt(B, e.utf8("first"));
				await bob.decrypt(A, c.type, c.body);
				const r = await bob.encrypt(A, e.utf8("answer"));
				await alice.decrypt(B, r.type, r.body);
				await bob.store.close();
			}
			window.cts = [];
			(async () => { for (let i = 0; ; i++) {
				const c = await alice.encrypt(B, e.utf8("m" + i));
				console.log("CT " + JSON.stringify({ i, type: c.type, body: e.toBase64(c.body) }));
			} })();
			return true;
		})()`, &ok)
		// Close the tab once it has handed out some ciphertexts.
		want := 5 + round*7
		deadline := time.Now().Add(30 * time.Second)
		for len(ciphertexts(b, writer.name)) < want {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d ciphertexts", round, len(ciphertexts(b, writer.name)))
			}
			time.Sleep(5 * time.Millisecond)
		}
		closeTab(t, writer)
		cts := ciphertexts(b, writer.name)
		raw, _ := json.Marshal(cts)
		var res struct {
			Opened int
			After  string
			Back   string
			Err    string
		}
		second.evalAsync(`(async () => {
			const e = await `+e2eeModule+`;
			const A = { user: "alice", device: "a" }, B = { user: "bob", device: "b" };
			const r = { Opened: 0 };
			try {
				const alice = await e.Device.open(await e.IDBStore.open("alice"), A);
				const bob = await e.Device.open(await e.IDBStore.open("bob"), B);
				for (const c of `+string(raw)+`.reverse()) {
					if (e.fromUtf8(await bob.decrypt(A, c.type, e.fromBase64(c.body))) !== "m" + c.i) throw new Error("message " + c.i);
					r.Opened++;
				}
				const a = await alice.encrypt(B, e.utf8("after"));
				r.After = e.fromUtf8(await bob.decrypt(A, a.type, a.body));
				const k = await bob.encrypt(A, e.utf8("back"));
				r.Back = e.fromUtf8(await alice.decrypt(B, k.type, k.body));
				await alice.store.close();
				await bob.store.close();
			} catch (err) { r.Err = String(err) }
			return r;
		})()`, &res)
		if res.Err != "" || res.Opened != len(cts) || res.After != "after" || res.Back != "back" {
			t.Fatalf("round %d: %d ciphertexts from the closed tab: %+v", round, len(cts), res)
		}
	}
}

type ct struct {
	I    int    `json:"i"`
	Type int    `json:"type"`
	Body string `json:"body"`
}

// ciphertexts are the "CT {…}" console lines of the tab named name.
func ciphertexts(b *browser, name string) []ct {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []ct
	for _, l := range b.logs {
		p := name + ": log CT "
		if !strings.HasPrefix(l, p) {
			continue
		}
		s := strings.TrimPrefix(l, p)
		if i := strings.LastIndex(s, " ("); i >= 0 {
			s = s[:i]
		}
		var c ct
		if json.Unmarshal([]byte(s), &c) == nil {
			out = append(out, c)
		}
	}
	return out
}

// closeTab closes the tab's target, as a user closing it does.
func closeTab(t *testing.T, tb *tab) {
	t.Helper()
	if err := chromedp.Cancel(tb.ctx); err != nil {
		t.Logf("close tab: %v", err)
	}
}

// TestWebE2EEDeviceLock: one tab of a profile holds a device's Web Lock;
// another asking with ifAvailable is refused (null) while it lives, and a
// third, waiting, gets the lock once the owner's tab is closed.
func TestWebE2EEDeviceLock(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	holder := b.user("holder")
	owner, other := holder.another("owner"), holder.another("other")
	for _, tb := range []*tab{owner, other} {
		tb.run(chromedp.Navigate(n.url()), chromedp.WaitVisible(chromedp.ID("login-name")))
	}
	var ok bool
	owner.evalAsync(`(async () => {
		const e = await `+e2eeModule+`;
		await new Promise((res) => { e.withDeviceLock("alice/web-1", () => { res(); return new Promise(() => {}); }); });
		return true;
	})()`, &ok)
	var got string
	other.evalAsync(`(async () => {
		const e = await `+e2eeModule+`;
		const r = await e.withDeviceLock("alice/web-1", async () => "ran", { ifAvailable: true });
		window.waited = e.withDeviceLock("alice/web-1", async () => "ran after the owner closed");
		return r === null ? "refused" : r;
	})()`, &got)
	if got != "refused" {
		t.Fatalf("second tab while the owner lives: %q", got)
	}
	closeTab(t, owner)
	other.evalAsync(`window.waited`, &got)
	if got != "ran after the owner closed" {
		t.Fatalf("after the owner closed: %q", got)
	}
}

// evalAsyncLong is evalAsync with a bound for a long computation (the
// benchmark's thousands of messages).
func (t *tab) evalAsyncLong(expr string, out any) {
	t.b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, 10*time.Minute)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](expr, chromedp.EvalAwaitPromise))
	if err == nil {
		err = json.Unmarshal(raw, out)
	}
	if err != nil {
		t.b.t.Fatalf("%s: evaluate: %v", t.name, err)
	}
}
