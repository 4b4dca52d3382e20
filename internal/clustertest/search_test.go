package clustertest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/search/opensearch"
	"github.com/parley-im/parley/protocol"
)

// searchIndex opens the cluster's OpenSearch indexes (their prefix is
// the namespace's) and drops them when the test ends.
func searchIndex(t *testing.T, c *Cluster, urls []string) *opensearch.Index {
	t.Helper()
	cfg := opensearch.Config{URLs: urls, Prefix: c.keyspace + "-search"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x, err := opensearch.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		x.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := opensearch.Drop(ctx, cfg); err != nil {
			t.Logf("drop the cluster's indexes: %v", err)
		}
	})
	return x
}

// findSeqs is what w's search for text finds (at most 100, sorted).
func findSeqs(w *ws, q protocol.SearchQuery) []uint64 {
	w.t.Helper()
	if q.Limit == 0 {
		q.Limit = 100
	}
	f := must(w.t, w.call(protocol.Frame{Type: protocol.TypeSearch, Query: &q}), protocol.TypeSearch)
	var seqs []uint64
	for _, h := range f.Search.Hits {
		seqs = append(seqs, h.Seq)
	}
	slices.Sort(seqs)
	return seqs
}

// waitFound polls until w's search for text finds exactly want (the index
// is written after the ACK).
func waitFound(w *ws, text string, want ...uint64) {
	w.t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := findSeqs(w, protocol.SearchQuery{Text: text})
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("search %q: %v, want %v", text, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterSearch: with search.opensearch_url, the chat processes index
// what is sent into OpenSearch and answer search from it through any
// gateway: a member finds a Chinese and an English phrase, a non-member
// nothing; an edit replaces the text found, a recall removes it; in a
// group a removed member finds nothing said after it left and a late
// joiner nothing from before it joined; an end-to-end encrypted
// conversation (real E2E clients) leaves no document in OpenSearch and no
// trace of its plaintext canary, while a plain conversation's control
// text is found there.
func TestClusterSearch(t *testing.T) {
	urls := enginetest.OpenSearch(t).URLs
	c := Start(t, Options{Gateways: 2, Chats: 2, Extra: []string{"--search.opensearch-url", urls[0]}})
	x := searchIndex(t, c, urls)
	alice := dial(t, c, c.Gateways[0], "alice", "phone")
	bob := dial(t, c, c.Gateways[1], "bob", "phone")
	carol := dial(t, c, c.Gateways[1], "carol", "phone")
	dave := dial(t, c, c.Gateways[0], "dave", "phone")
	conv := must(t, alice.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}), protocol.TypeConv).Conv.ConvID
	sendTo := func(conv uint64, id, body string) uint64 {
		return must(t, alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Body: body}), protocol.TypeAck).Seq
	}
	report := sendTo(conv, "a", "the quarterly report 季度报告 is ready")
	lunch := sendTo(conv, "b", "lunch at noon 中午吃饭")
	waitFound(bob, "季度报告", report)
	waitFound(bob, "Quarterly Report", report)
	waitFound(alice, "吃饭", lunch)
	if got := findSeqs(carol, protocol.SearchQuery{Text: "季度报告"}); len(got) != 0 {
		t.Fatalf("a non-member found %v", got)
	}
	must(t, alice.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "c", TargetSeq: report, Body: "the annual budget 年度预算"}), protocol.TypeAck)
	waitFound(bob, "年度预算", report)
	waitFound(bob, "季度报告")
	must(t, alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: conv, ClientMsgID: "d", TargetSeq: lunch}), protocol.TypeAck)
	waitFound(bob, "吃饭")
	// The index settles on the one edited message. (While a partition
	// moves between the processes at start, its old owner's round in
	// flight can write an older image the new owner then replaces.)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := x.Count(context.Background(), conv)
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the direct conversation's documents after an edit and a recall: %d (%v), want 1", n, err)
		}
	}

	// Membership windows, applied by the engine.
	group := must(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "windows", Members: []string{"bob", "carol"}}), protocol.TypeConv).Conv.ConvID
	g1 := sendTo(group, "g1", "下周的会议在北京举行")
	waitFound(carol, "北京", g1)
	must(t, alice.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: group, Members: []string{"bob"}}), protocol.TypeConv)
	g2 := sendTo(group, "g2", "北京 after bob left")
	must(t, alice.call(protocol.Frame{Type: protocol.TypeAddMembers, ConvID: group, Members: []string{"dave"}}), protocol.TypeConv)
	g3 := sendTo(group, "g3", "北京 once dave joined")
	waitFound(carol, "北京", g1, g2, g3)
	waitFound(bob, "北京", g1)  // nothing after leaving
	waitFound(dave, "北京", g3) // nothing before joining
	if got := findSeqs(carol, protocol.SearchQuery{Text: "北京", ConvID: group, FromSeq: g2}); !slices.Equal(got, []uint64{g2, g3}) {
		t.Fatalf("from_seq: %v", got)
	}

	// End-to-end encrypted: the real clients' messages, never indexed.
	ea := startE2EPeer(t, c, c.Gateways[0], "erin")
	eb := startE2EPeer(t, c, c.Gateways[1], "frank")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e2eConv, err := ea.c.OpenDirectE2E(ctx, "frank")
	if err != nil || !e2eConv.E2E {
		t.Fatalf("open E2E direct: %+v %v", e2eConv, err)
	}
	plain, err := ea.c.OpenDirect(ctx, "frank")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := ea.m.SendDirect(ctx, e2eConv.ConvID, "frank", fmt.Sprintf("%s %d", searchCanary, i)); err != nil {
			t.Fatal(err)
		}
		if _, err := eb.m.SendDirect(ctx, e2eConv.ConvID, "erin", fmt.Sprintf("%s reply %d", searchCanary, i)); err != nil {
			t.Fatal(err)
		}
	}
	ack, err := ea.c.Send(ctx, plain.ConvID, searchControl)
	if err != nil {
		t.Fatal(err)
	}
	// Once the plain conversation, sent last, is indexed the E2E one
	// would have been too.
	erin := dial(t, c, c.Gateways[0], "erin", "raw")
	waitFound(erin, searchControl, ack.Seq)
	if got := findSeqs(erin, protocol.SearchQuery{Text: searchCanary}); len(got) != 0 {
		t.Fatalf("search finds the E2E canary: %v", got)
	}
	if n, err := x.Count(ctx, e2eConv.ConvID); err != nil || n != 0 {
		t.Fatalf("OpenSearch holds %d documents of the E2E conversation (%v)", n, err)
	}
	// The index's contents, queried directly: every field, the canary as
	// written, as the base64 a stored envelope carries, and by its rare
	// token; the control is found the same way, so the queries can see.
	prefix := c.keyspace + "-search"
	b64 := base64.StdEncoding.EncodeToString([]byte(searchCanary))
	for _, q := range []string{searchCanary, b64[:24], "7f3a9c"} {
		if n := rawCount(t, urls[0], prefix, q); n != 0 {
			t.Fatalf("OpenSearch's indexes hold %d documents matching %q", n, q)
		}
	}
	if n := rawCount(t, urls[0], prefix, searchControl); n != 1 {
		t.Fatalf("OpenSearch's indexes hold %d documents of the control text, want 1: the check cannot see", n)
	}
}

const (
	searchCanary  = "CANARY-7f3a9c-plaintext-must-never-reach-the-server"
	searchControl = "CONTROL-5e1d0b-plaintext-in-a-plaintext-conversation"
)

// rawCount counts the documents of every index under prefix that match
// text as a phrase in any field (simple_query_string over "*").
func rawCount(t *testing.T, url, prefix, text string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"query": map[string]any{"simple_query_string": map[string]any{
		"query": `"` + text + `"`, "fields": []string{"*"}, "lenient": true}}})
	resp, err := http.Post(url+"/"+prefix+"-*/_count", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Count  int `json:"count"`
		Shards struct {
			Total, Successful int
		} `json:"_shards"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("count %q: %d %v", text, resp.StatusCode, err)
	}
	if r.Shards.Total < 2 || r.Shards.Successful != r.Shards.Total {
		t.Fatalf("count %q: shards %+v: both indexes must answer", text, r.Shards)
	}
	return r.Count
}

// e2ePeer is a Go E2E user (client/e2eechat, what the CLI runs).
type e2ePeer struct {
	c *client.Client
	m *e2eechat.Messenger
}

func startE2EPeer(t *testing.T, c *Cluster, g *Proc, user string) *e2ePeer {
	t.Helper()
	cl, err := client.New(client.Config{URL: g.URL(), Token: c.Token(user), Device: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cl.Run(ctx) }()
	go func() {
		for range cl.Events() {
		}
	}()
	t.Cleanup(func() { cancel(); cl.Close(); <-done })
	st := e2ee.NewMemoryStore()
	d, err := e2ee.OpenDevice(st, e2ee.Address{User: user, Device: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateAccountKey(); err != nil {
		t.Fatal(err)
	}
	m := e2eechat.New(cl, d, st)
	pctx, pcancel := context.WithTimeout(context.Background(), time.Minute)
	defer pcancel()
	if _, err := m.PublishKeys(pctx, 5); err != nil {
		t.Fatalf("publish keys of %s: %v", user, err)
	}
	return &e2ePeer{c: cl, m: m}
}
