package web_test

// Browser tests of the page's attachments: a picture exchanged (thumbnail,
// then the full image), drag and drop and paste, a file with its upload
// progress and download, a voice note recorded with Chromium's fake
// microphone and played, an E2E conversation's file as a placeholder, and
// uploaded HTML and SVG opened through their URLs without running script
// in the page's origin.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/parley-im/parley/internal/config"
)

// the smallest parts the server takes (S3's), so that a test file goes up in several.
const testPartBytes = 5 << 20

func smallParts(c *config.Config) { c.Attach.PartBytes = testPartBytes }

// writeFile writes data under a fresh directory as name; returns its path.
func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// gradientPNG is a w×h PNG (a gradient, so the thumbnail is not blank).
func gradientPNG(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{uint8(x * 255 / w), uint8(y * 255 / h), 160, 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// evalAsync is eval for an expression that yields a promise.
func (t *tab) evalAsync(expr string, out any) {
	t.b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, 30*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](expr, chromedp.EvalAwaitPromise))
	if err == nil {
		err = json.Unmarshal(raw, out)
	}
	if err != nil {
		t.shot("failed")
		t.b.t.Fatalf("%s: evaluate: %v", t.name, err)
	}
}

// downloadsTo saves the downloads of t's browser context in a fresh directory.
func (t *tab) downloadsTo() string {
	t.b.t.Helper()
	dir := t.b.t.TempDir()
	ctx, cancel := context.WithTimeout(t.ctx, 10*time.Second)
	defer cancel()
	_, err := chromedp.CallBrowser(ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: "allow", BrowserContextID: chromedp.FromContext(t.ctx).BrowserContextID, DownloadPath: dir,
	})
	if err != nil {
		t.b.t.Fatalf("%s: set download behavior: %v", t.name, err)
	}
	return dir
}

// waitFile waits for a complete download named name in dir and returns its bytes.
func waitFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			if _, err := os.Stat(filepath.Join(dir, name+".crdownload")); os.IsNotExist(err) {
				return b
			}
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(dir)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Fatalf("no download %s in %s (has %v)", name, dir, names)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rpc sends one frame as user over /v1/rpc and returns the answer (failing
// on an error answer).
func (n *node) rpc(user, frame string) map[string]any {
	n.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, n.srv.HTTPURL+"/v1/rpc?device=script", strings.NewReader(frame))
	req.Header.Set("Authorization", "Bearer "+n.srv.Token(user))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || out["type"] == "error" {
		n.t.Fatalf("rpc %s: %d %v %v", frame, resp.StatusCode, err, out)
	}
	return out
}

// uploadAs uploads data to conv as user through the protocol (one part)
// and returns the attachment id.
func (n *node) uploadAs(user, conv string, data []byte, mediaType, name string) string {
	n.t.Helper()
	sum := sha256.Sum256(data)
	up := n.rpc(user, fmt.Sprintf(`{"type":"upload_create","conv_id":%q,"size":%d,"sha256":%q,"media_type":%q,"name":%q}`,
		conv, len(data), hex.EncodeToString(sum[:]), mediaType, name))["upload"].(map[string]any)
	id := up["attachment_id"].(string)
	part := n.rpc(user, fmt.Sprintf(`{"type":"upload_part","attachment_id":%q,"part":1}`, id))["upload"].(map[string]any)
	req, _ := http.NewRequest(http.MethodPut, n.srv.HTTPURL+part["url"].(string), bytes.NewReader(data))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		n.t.Fatalf("PUT part: %d", resp.StatusCode)
	}
	n.rpc(user, fmt.Sprintf(`{"type":"upload_complete","attachment_id":%q}`, id))
	return id
}

const thumbShown = `(() => { const i = document.querySelector("#messages .thumb img"); return !!i && i.complete && i.naturalWidth > 0 })()`

// TestWebPicture: alice sends a picture with the attach control; both see
// the server's thumbnail inline, bob opens the full image and closes it
// with Escape.
func TestWebPicture(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	alice, bob := b.user("alice"), b.user("bob")
	alice.login(n, "alice")
	bob.login(n, "bob")
	alice.openDirect("bob")
	alice.send("a picture for you")
	bob.openConv("alice")
	bob.waitBodies("a picture for you")
	alice.until("attach control", `!document.getElementById("attach").hidden && !document.getElementById("attach").disabled`)
	alice.run(chromedp.SetUploadFiles(chromedp.ID("file"), []string{writeFile(t, "sunset.png", gradientPNG(t, 640, 480))}))
	for _, tb := range []*tab{alice, bob} {
		tb.until("thumbnail shown", thumbShown)
		tb.shot("thumbnail")
	}
	var size []int
	bob.eval(`(() => { const i = document.querySelector("#messages .thumb img"); return [i.naturalWidth, i.naturalHeight] })()`, &size)
	if fmt.Sprint(size) != "[320 240]" {
		t.Fatalf("thumbnail is %v, want the server's 320×240 of the 640×480 picture", size)
	}
	var link string
	bob.eval(`document.querySelector("#messages .file a.download").textContent`, &link)
	if !strings.HasPrefix(link, "sunset.png · ") {
		t.Fatalf("download link %q", link)
	}
	bob.run(chromedp.Click(chromedp.CSS("#messages .thumb")))
	bob.until("full image", `(() => { const d = document.getElementById("viewer"), i = document.getElementById("viewer-img"); return d.open && i.complete && i.naturalWidth === 640 && i.naturalHeight === 480 })()`)
	bob.shot("full image")
	bob.run(chromedp.KeyEvent(kb.Escape))
	bob.until("viewer closed", `!document.getElementById("viewer").open`)
	bob.seqsOnce()
}

// TestWebDropAndPaste: a picture dropped onto the conversation and one
// pasted into the composer are sent like attached ones.
func TestWebDropAndPaste(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	alice, bob := b.user("alice"), b.user("bob")
	alice.login(n, "alice")
	bob.login(n, "bob")
	alice.openDirect("bob")
	alice.send("incoming")
	bob.openConv("alice")
	alice.until("attach control", `!document.getElementById("attach").hidden`)
	const makeFile = `(async (name, color) => {
		const c = document.createElement("canvas"); c.width = 400; c.height = 200;
		const g = c.getContext("2d"); g.fillStyle = color; g.fillRect(0, 0, 400, 200);
		g.fillStyle = "#fff"; g.font = "48px sans-serif"; g.fillText(name, 20, 120);
		const blob = await new Promise((r) => c.toBlob(r, "image/png"));
		const dt = new DataTransfer(); dt.items.add(new File([blob], name, { type: "image/png" }));
		return dt;
	})`
	alice.evalAsync(`(async () => {
		const dt = await `+makeFile+`("dropped.png", "#0f766e");
		document.getElementById("chat").dispatchEvent(new DragEvent("dragenter", { bubbles: true, cancelable: true, dataTransfer: dt }));
		window.__drop = dt;
		return true })()`, new(bool))
	alice.until("drop target shown", `document.getElementById("chat").classList.contains("drop")`)
	alice.shot("dragging over")
	alice.eval(`(() => { const chat = document.getElementById("chat");
		chat.dispatchEvent(new DragEvent("dragover", { bubbles: true, cancelable: true, dataTransfer: window.__drop }));
		chat.dispatchEvent(new DragEvent("drop", { bubbles: true, cancelable: true, dataTransfer: window.__drop }));
		return !chat.classList.contains("drop") })()`, new(bool))
	bob.until("dropped picture", `[...document.querySelectorAll("#messages .thumb img")].some(i => i.alt === "dropped.png" && i.complete && i.naturalWidth > 0)`)
	alice.evalAsync(`(async () => {
		const dt = await `+makeFile+`("pasted.png", "#7c3aed");
		const ev = new ClipboardEvent("paste", { bubbles: true, cancelable: true, clipboardData: dt });
		document.getElementById("text").dispatchEvent(ev);
		return ev.defaultPrevented })()`, new(bool))
	for _, tb := range []*tab{alice, bob} {
		tb.until("pasted picture", `[...document.querySelectorAll("#messages .thumb img")].some(i => i.alt === "pasted.png" && i.complete && i.naturalWidth > 0)`)
		tb.shot("dropped and pasted")
		tb.seqsOnce()
	}
	var text string
	alice.eval(`document.getElementById("text").value`, &text)
	if text != "" {
		t.Fatalf("the paste put %q into the composer", text)
	}
}

// pauseUploads holds the page's part uploads after the first `let` of them
// (DevTools request interception) until release is called.
func (t *tab) pauseUploads(let int) (release func()) {
	t.b.t.Helper()
	var mu sync.Mutex
	var held []fetch.RequestID
	released := false
	seen := 0
	ids := make(chan fetch.RequestID, 64)
	ctx, cancel := context.WithCancel(t.ctx)
	if err := chromedp.Listen(ctx, func(ev any) {
		p, ok := ev.(*fetch.EventRequestPaused)
		if !ok {
			return
		}
		mu.Lock()
		seen++
		hold := !released && seen > let
		if hold {
			held = append(held, p.RequestID)
		}
		mu.Unlock()
		if !hold {
			ids <- p.RequestID
		}
	}); err != nil {
		t.b.t.Fatalf("listen: %v", err)
	}
	cont := func(id fetch.RequestID) {
		_, _ = chromedp.Call(t.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: id})
	}
	go func() {
		for {
			select {
			case id := <-ids:
				cont(id)
			case <-ctx.Done():
				return
			}
		}
	}()
	if _, err := chromedp.Call(t.ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/v1/uploads/*"}}}); err != nil {
		t.b.t.Fatalf("fetch.enable: %v", err)
	}
	return func() {
		mu.Lock()
		released = true
		h := held
		held = nil
		mu.Unlock()
		for _, id := range h {
			cont(id)
		}
		_, _ = chromedp.Call(t.ctx, fetch.Disable, cdp.Empty{})
		cancel()
	}
}

// TestWebFileDownload: a file that is not an image goes up in parts with a
// progress bar (held at half way for the screenshot) and reaches the peer
// as a download link with its name and size; clicking it downloads the
// very bytes.
func TestWebFileDownload(t *testing.T) {
	n := startNode(t, smallParts)
	b := newBrowser(t)
	alice, bob := b.user("alice"), b.user("bob")
	alice.login(n, "alice")
	bob.login(n, "bob")
	alice.openDirect("bob")
	alice.send("the report")
	bob.openConv("alice")
	data := make([]byte, 4*testPartBytes)
	_, _ = rand.Read(data)
	release := alice.pauseUploads(2)
	alice.run(chromedp.SetUploadFiles(chromedp.ID("file"), []string{writeFile(t, "report.pdf", data)}))
	// Two of four parts are in; the third is held (its bytes may count as
	// sent before the interception holds it).
	alice.until("progress at half way", `(() => { const p = document.querySelector("#uploads progress"); return !!p && p.value >= 50 && p.value < 100 })()`)
	var pct []string
	alice.eval(`[String(document.querySelector("#uploads progress").value) + "%", document.querySelector("#uploads .pct").textContent]`, &pct)
	if pct[0] != pct[1] {
		t.Fatalf("progress label %q, bar at %s", pct[1], pct[0])
	}
	alice.shot("upload progress")
	release()
	alice.until("upload done", `document.querySelectorAll("#uploads li").length === 0`)
	bob.until("download link", `[...document.querySelectorAll("#messages a.download")].some(a => a.textContent === "report.pdf · 20 MB")`)
	bob.shot("download link")
	dir := bob.downloadsTo()
	bob.run(chromedp.Click(chromedp.CSS("#messages a.download")))
	if got := waitFile(t, dir, "report.pdf"); !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes, not the %d uploaded", len(got), len(data))
	}
	bob.shot("downloaded")
}

// TestWebVoiceNote: alice records a voice note with Chromium's fake
// microphone; it reaches bob as an audio player, which plays.
func TestWebVoiceNote(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t, chromedp.Flag("use-fake-ui-for-media-stream", true), chromedp.Flag("use-fake-device-for-media-stream", true),
		chromedp.Flag("autoplay-policy", "no-user-gesture-required"))
	alice, bob := b.user("alice"), b.user("bob")
	alice.login(n, "alice")
	bob.login(n, "bob")
	alice.openDirect("bob")
	alice.send("listen")
	bob.openConv("alice")
	alice.until("record control", `!document.getElementById("record").hidden`)
	alice.run(chromedp.Click(chromedp.ID("record")))
	alice.until("recording", `document.getElementById("record").getAttribute("aria-pressed") === "true" && !document.getElementById("recording").hidden`)
	time.Sleep(1500 * time.Millisecond)
	alice.shot("recording")
	alice.run(chromedp.Click(chromedp.ID("record")))
	alice.until("recording stopped", `document.getElementById("record").getAttribute("aria-pressed") === "false"`)
	const player = `document.querySelector("#messages .file audio")`
	for _, tb := range []*tab{alice, bob} {
		tb.until("audio player", `!!`+player+` && `+player+`.readyState >= 1`)
	}
	var label string
	bob.eval(`document.querySelector("#messages .file .duration").textContent`, &label)
	if !regexp.MustCompile(`^0:0[1-4]$`).MatchString(label) {
		t.Fatalf("duration label %q, want the 1.5 s recorded (and the time to start and stop)", label)
	}
	bob.evalAsync(player+`.play().then(() => true)`, new(bool))
	bob.until("playing", player+`.currentTime > 0.3 && `+player+`.duration > 0`)
	bob.shot("playing")
	var name string
	bob.eval(`document.querySelector("#messages .file a.download").textContent`, &name)
	if !strings.HasPrefix(name, "voice-note-") {
		t.Fatalf("voice note named %q", name)
	}
}

// TestWebEncryptedFilePlaceholder: a file message in an end-to-end
// encrypted conversation, which the page cannot decrypt, shows as a
// placeholder (not its envelope), and the page offers no upload there
// (it cannot encrypt).
func TestWebEncryptedFilePlaceholder(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	bob := b.user("bob")
	bob.login(n, "bob")
	conv := n.rpc("alice", `{"type":"create_group","name":"sealed","members":["bob"],"e2e":true}`)["conv"].(map[string]any)["conv_id"].(string)
	cipher := make([]byte, 1024)
	_, _ = rand.Read(cipher)
	id := n.uploadAs("alice", conv, cipher, "application/octet-stream", "encrypted")
	envelope := `{"e2e":1,"group":"c2VhbGVkIGZpbGUgbWVzc2FnZQ=="}`
	n.rpc("alice", fmt.Sprintf(`{"type":"send","conv_id":%q,"client_msg_id":"f1","kind":"file","attachment_id":%q,"body":%q}`, conv, id, envelope))
	bob.openConv("sealed")
	bob.until("placeholder", `[...document.querySelectorAll("#messages .file.placeholder")].some(e => e.textContent.includes("Encrypted attachment"))`)
	var text string
	bob.eval(`document.getElementById("messages").textContent`, &text)
	if strings.Contains(text, `"e2e"`) || strings.Contains(text, "{") {
		t.Fatalf("the envelope shows: %q", text)
	}
	var disabled bool
	bob.eval(`document.getElementById("attach").disabled && document.getElementById("record").disabled`, &disabled)
	if !disabled {
		t.Fatal("attach and record are offered in an E2E conversation")
	}
	bob.shot("encrypted placeholder")
}

// beacon records the requests a hostile file's script makes.
type beacon struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits []string
}

func newBeacon(t *testing.T) *beacon {
	bc := &beacon{}
	bc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/control" {
			// The same payload served with no protection: it must run,
			// which shows the payload itself works in this browser.
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(evilHTML(bc.srv.URL, "control")))
			return
		}
		if strings.HasPrefix(r.URL.Path, "/hit/") { // not the browser's own /favicon.ico
			bc.mu.Lock()
			bc.hits = append(bc.hits, r.URL.Path)
			bc.mu.Unlock()
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(bc.srv.Close)
	return bc
}

func (bc *beacon) seen() []string {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return append([]string(nil), bc.hits...)
}

// The payload: marks the origin it runs in (its storage, cookies, the
// opener and the parent when they are of its origin) and calls the beacon.
const payloadJS = `
var hit = function (w) { try { new Image().src = "BEACON/hit/" + w; } catch (e) {} try { fetch("BEACON/hit/" + w, { mode: "no-cors" }); } catch (e) {} };
try { localStorage.setItem("pwned", "WHAT"); } catch (e) {}
try { document.cookie = "pwned=WHAT; path=/"; } catch (e) {}
try { if (window.opener) window.opener.pwned = "WHAT"; } catch (e) {}
try { if (window.parent !== window) window.parent.pwned = "WHAT"; } catch (e) {}
hit("WHAT");
`

func payload(beaconURL, what string) string {
	return strings.NewReplacer("BEACON", beaconURL, "WHAT", what).Replace(payloadJS)
}

func evilHTML(beaconURL, what string) string {
	return `<!doctype html><title>evil</title><h1>evil</h1><script>` + payload(beaconURL, what) + `</script>`
}

func evilSVG(beaconURL, what string) string {
	return `<svg xmlns="http://www.w3.org/2000/svg" width="100" height="100" onload="hit && hit('` + what + `-onload')">` +
		`<script>` + payload(beaconURL, what) + `</script><rect width="100" height="100" fill="red"/></svg>`
}

// TestWebAttachmentCannotScript: HTML and SVG files with script, and HTML
// declared as a PNG, uploaded through the page and opened through their
// attachment URLs in every way a page could be made to (a new window, a
// same-origin iframe, a top-level navigation, an <img>), never run script
// in the page's origin: the served headers download or sandbox them, and
// neither the origin's storage, cookies, the opener or parent window nor
// the watching beacon ever see the payload. The same payload served
// without protection does run (the control).
func TestWebAttachmentCannotScript(t *testing.T) {
	n := startNode(t)
	bc := newBeacon(t)
	b := newBrowser(t, chromedp.Flag("disable-popup-blocking", true))
	// What the browser says while it refuses the files' script and content
	// (the CSP, the sandbox, downloads from frames, an image that is not
	// one) is expected here; the assertions below are the test.
	b.mu.Lock()
	b.tolerate = regexp.MustCompile(`(?i)content security policy|sandbox|refused|download|/v1/files/`)
	b.allowNetErrors = true
	b.mu.Unlock()
	alice, bob := b.user("alice"), b.user("bob")
	alice.login(n, "alice")
	bob.login(n, "bob")
	alice.openDirect("bob")
	alice.send("files")
	bob.openConv("alice")
	files := []string{
		writeFile(t, "evil.html", []byte(evilHTML(bc.srv.URL, "html"))),
		writeFile(t, "evil.svg", []byte(evilSVG(bc.srv.URL, "svg"))),
		writeFile(t, "evil.png", []byte(evilHTML(bc.srv.URL, "fakepng"))),
	}
	alice.until("attach control", `!document.getElementById("attach").hidden`)
	alice.run(chromedp.SetUploadFiles(chromedp.ID("file"), files))
	bob.until("three links", `document.querySelectorAll("#messages a.download").length === 3`)
	bob.shot("hostile files")
	downloads := bob.downloadsTo()

	// The URLs, as the page gets them.
	conv := n.rpc("bob", `{"type":"conv_list"}`)["list"].([]any)[0].(map[string]any)["conv_id"].(string)
	hist := n.rpc("bob", fmt.Sprintf(`{"type":"history","conv_id":%q,"after_seq":0}`, conv))["messages"].([]any)
	type file struct{ name, url string }
	var got []file
	for _, m := range hist {
		m := m.(map[string]any)
		if m["kind"] != "file" {
			continue
		}
		var body struct{ Name string }
		_ = json.Unmarshal([]byte(m["body"].(string)), &body)
		a := n.rpc("bob", fmt.Sprintf(`{"type":"attachment_url","conv_id":%q,"seq":%v}`, conv, m["seq"]))["attachment"].(map[string]any)
		got = append(got, file{body.Name, n.srv.HTTPURL + a["url"].(string)})
	}
	if len(got) != 3 {
		t.Fatalf("%d file messages, want 3", len(got))
	}
	for _, f := range got {
		t.Run(f.name, func(t *testing.T) {
			var h map[string]string
			bob.evalAsync(`fetch(`+js(f.url)+`).then(r => ({ status: String(r.status), type: r.headers.get("content-type") || "",
				disposition: r.headers.get("content-disposition") || "", csp: r.headers.get("content-security-policy") || "",
				nosniff: r.headers.get("x-content-type-options") || "" }))`, &h)
			if h["status"] != "200" || h["nosniff"] != "nosniff" || !strings.Contains(h["csp"], "sandbox") {
				t.Fatalf("%s served with %v: want 200, nosniff and a sandboxing CSP", f.name, h)
			}
			if f.name == "evil.png" {
				if h["type"] != "image/png" {
					t.Fatalf("HTML declared as a PNG served as %q", h["type"])
				}
			} else if h["type"] != "application/octet-stream" || !strings.HasPrefix(h["disposition"], "attachment") {
				t.Fatalf("%s served as %q, %q: want application/octet-stream as an attachment", f.name, h["type"], h["disposition"])
			}
			// A new window (its opener is the page), a same-origin iframe, an image.
			bob.eval(`(() => {
				window.open(`+js(f.url)+`, "_blank");
				const fr = document.createElement("iframe"); fr.className = "probe"; fr.src = `+js(f.url)+`; document.body.append(fr);
				const im = document.createElement("img"); im.className = "probe"; im.src = `+js(f.url)+`; document.body.append(im);
				return true })()`, new(bool))
			// A top-level navigation in another tab of bob's.
			nav := bob.another("bob navigates to " + f.name)
			ctx, cancel := context.WithTimeout(nav.ctx, 10*time.Second)
			_ = chromedp.Do(ctx, chromedp.Navigate(f.url)) // a download aborts the navigation: no error check
			cancel()
			time.Sleep(1500 * time.Millisecond)
			nav.shot("navigated")
			if f.name != "evil.png" {
				waitFile(t, downloads, f.name) // served as a download, not rendered
			}
		})
	}
	var state map[string]string
	bob.eval(`({ window: String(window.pwned), storage: String(localStorage.getItem("pwned")), cookie: document.cookie })`, &state)
	// The windows it opened are in front: a tab in the background draws no screenshot.
	if _, err := chromedp.Call(bob.ctx, page.BringToFront, cdp.Empty{}); err != nil {
		t.Fatalf("bring to front: %v", err)
	}
	bob.shot("after opening them")
	if state["window"] != "undefined" || state["storage"] != "null" || strings.Contains(state["cookie"], "pwned") {
		t.Fatalf("a hostile file ran script in the page's origin: %v", state)
	}
	if hits := bc.seen(); len(hits) > 0 {
		t.Fatalf("a hostile file's script ran: the beacon saw %v", hits)
	}
	// The control: the same payload, unprotected, runs and calls the beacon.
	bob.eval(`(window.open(`+js(bc.srv.URL+"/control")+`, "_blank"), true)`, new(bool))
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(strings.Join(bc.seen(), ","), "/hit/control") {
		if time.Now().After(deadline) {
			t.Fatalf("the control payload never called the beacon (saw %v): the test could not see an attack", bc.seen())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, h := range bc.seen() {
		if h != "/hit/control" {
			t.Fatalf("beacon saw %q besides the control", h)
		}
	}
}
