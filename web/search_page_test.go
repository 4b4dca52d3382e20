package web_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestWebServerSearch: the page's search box finds Chinese and English
// phrases in the user's plain conversations on the server, marks the
// matched words in each result, and a click opens the conversation
// scrolled to the message — also one far back in the history, outside the
// page first loaded; a phrase said nowhere says so.
func TestWebServerSearch(t *testing.T) {
	n := startNode(t)
	b := newBrowser(t)
	bob := b.user("bob")
	bob.login(n, "bob")
	rpc := n.rpcAs("alice")
	conv := rpc(`{"type":"open_direct","peer":"bob"}`)["conv"].(map[string]any)["conv_id"].(string)
	send := func(i int, body string) {
		if r := rpc(fmt.Sprintf(`{"type":"send","conv_id":%q,"client_msg_id":"c%d","body":%q}`, conv, i, body)); r["type"] != "ack" {
			t.Fatalf("send: %v", r)
		}
	}
	send(1, "下周的会议在北京举行，请准备报告")
	for i := 2; i <= 60; i++ {
		send(i, fmt.Sprintf("filler %d", i))
	}
	send(61, "Quarterly report is due on Friday")

	search := func(text string) {
		bob.eval(`document.getElementById("msearch-input").value = "", true`, new(bool))
		bob.run(chromedp.SendKeys(chromedp.ID("msearch-input"), text), chromedp.Click(chromedp.CSS("#msearch-form button")))
	}
	// A phrase in the page not loaded yet (seq 1, 60 messages back).
	search("北京举行")
	bob.until("Chinese hit", `document.querySelectorAll("#msearch-hits li button").length === 1`)
	var marks []string
	bob.eval(`[...document.querySelectorAll("#msearch-hits mark")].map(m => m.textContent)`, &marks)
	if strings.Join(marks, "") != "北京举行" {
		t.Fatalf("marked %q, want 北京举行", marks)
	}
	bob.shot("chinese results")
	bob.eval(`document.querySelector("#msearch-hits li button").click(), true`, new(bool))
	bob.until("message 1 shown and marked", `(() => { const li = document.querySelector('#messages li.found'); return !!li && li.dataset.seq === "1" && li.querySelector(".body").textContent.includes("北京举行") })()`)
	bob.until("message 1 in view", `(() => { const li = document.querySelector('#messages li.found'), box = document.getElementById("messages").getBoundingClientRect(), r = li.getBoundingClientRect(); return r.bottom > box.top && r.top < box.bottom })()`)
	bob.seqsOnce()
	// Every message between it and the latest is there: no hole.
	var shown int
	bob.eval(`document.querySelectorAll("#messages li:not(.system)[data-seq]").length`, &shown)
	if shown != 61 {
		t.Fatalf("%d messages shown after jumping back, want all 61", shown)
	}
	bob.shot("opened at the hit")

	// English, case-insensitive, stop words aside.
	search("quarterly REPORT")
	bob.until("English hit", `[...document.querySelectorAll("#msearch-hits li button")].length === 1 && document.querySelector("#msearch-hits .snippet").textContent.startsWith("Quarterly report")`)
	bob.eval(`[...document.querySelectorAll("#msearch-hits mark")].map(m => m.textContent)`, &marks)
	if strings.ToLower(strings.Join(marks, " ")) != "quarterly report" {
		t.Fatalf("marked %q, want Quarterly report", marks)
	}
	bob.shot("english results")

	search("nothing like this")
	bob.until("no hit", `document.getElementById("msearch-hits").children.length === 0 && !document.getElementById("msearch-status").hidden && document.getElementById("msearch-status").textContent.startsWith("No message matches")`)
	bob.shot("no results")
}
