package e2e

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

func (c *rawConn) search(q protocol.SearchQuery) *protocol.Frame {
	c.t.Helper()
	return c.call(protocol.Frame{Type: protocol.TypeSearch, Query: &q})
}

// seqsOf returns the seqs of a search answer's hits, sorted.
func seqsOf(t testing.TB, f *protocol.Frame) []uint64 {
	t.Helper()
	mustOK(t, f, protocol.TypeSearch)
	var seqs []uint64
	for _, h := range f.Search.Hits {
		seqs = append(seqs, h.Seq)
	}
	slices.Sort(seqs)
	return seqs
}

// waitFound polls until c's search for text finds want (the index is
// written after the ACK).
func (c *rawConn) waitFound(text string, want ...uint64) {
	c.t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := seqsOf(c.t, c.search(protocol.SearchQuery{Text: text, Limit: 100}))
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("search %q: %v, want %v", text, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSearchWindowsEditsRecalls: search over the WebSocket finds Chinese
// and English phrases in the caller's conversations only, within its
// membership: a removed member nothing said after it left, a late joiner
// nothing from before it joined; an edit replaces the text found, a recall
// removes it; snippets carry highlights.
func TestSearchWindowsEditsRecalls(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	bob := dialRaw(t, srv, "bob", "phone")
	carol := dialRaw(t, srv, "carol", "phone")
	dave := dialRaw(t, srv, "dave", "phone")
	eve := dialRaw(t, srv, "eve", "phone")
	conv := alice.createGroup("search", "bob", "carol")
	other := eve.createGroup("elsewhere", "dave")
	seq := func(f *protocol.Frame) uint64 { return mustOK(t, f, protocol.TypeAck).Seq }

	s1 := seq(alice.sendText(conv, "m1", "下周的会议在北京举行"))
	s2 := seq(alice.sendText(conv, "m2", "Lunch plans for Friday"))
	o1 := seq(eve.sendText(other, "o1", "北京 in another conversation"))
	carol.waitFound("北京", s1)
	bob.waitFound("lunch plans", s2)

	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"bob"}}), protocol.TypeConv)
	s3 := seq(alice.sendText(conv, "m3", "北京 after bob left"))
	alice.addMembers(conv, "dave")
	s4 := seq(alice.sendText(conv, "m4", "北京 once dave joined"))

	carol.waitFound("北京", s1, s3, s4)
	bob.waitFound("北京", s1)         // nothing after leaving
	dave.waitFound("北京", s4, o1)    // nothing before joining; its other conversation too
	eve.waitFound("北京", o1)         // never a member of conv
	alice.waitFound("bob left", s3) // an English phrase
	if got := seqsOf(t, carol.search(protocol.SearchQuery{Text: "left bob"})); len(got) != 0 {
		t.Fatalf("words out of order found %v", got)
	}
	// One conversation, a seq range, a sender.
	if got := seqsOf(t, carol.search(protocol.SearchQuery{Text: "北京", ConvID: conv, FromSeq: s3})); !slices.Equal(got, []uint64{s3, s4}) {
		t.Fatalf("from_seq: %v", got)
	}
	if got := seqsOf(t, dave.search(protocol.SearchQuery{Text: "北京", Sender: "eve"})); !slices.Equal(got, []uint64{o1}) {
		t.Fatalf("sender: %v", got)
	}
	if f := bob.search(protocol.SearchQuery{Text: "北京", ConvID: other}); f.Code != protocol.CodeNotMember {
		t.Fatalf("search of a conversation bob never joined: %+v", f)
	}
	// Newest first, highlights on the phrase.
	f := mustOK(t, carol.search(protocol.SearchQuery{Text: "北京"}), protocol.TypeSearch)
	if h := f.Search.Hits[0]; h.Seq != s4 || h.Sender != "alice" || h.MsgID == 0 || len(h.Highlights) != 1 {
		t.Fatalf("first hit %+v", h)
	} else if u := []rune(h.Snippet); string(u[h.Highlights[0][0]:h.Highlights[0][1]]) != "北京" {
		t.Fatalf("highlight %v of %q", h.Highlights, h.Snippet)
	}

	// An edit replaces the text; a recall removes it.
	e := seq(alice.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "e1", TargetSeq: s2, Body: "Dinner plans for Saturday"}))
	seq(alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: conv, ClientMsgID: "r1", TargetSeq: s1}))
	_ = e
	carol.waitFound("dinner plans", s2)
	carol.waitFound("北京", s3, s4)
	carol.waitFound("lunch")
	carol.waitFound("会议")
	// bob left before the edit: what he may read of s2 is "Lunch plans",
	// which the index no longer holds, and the edited text is not his.
	bob.waitFound("dinner")
	bob.waitFound("lunch")
}

// TestSearchPagingAndBadQueries: pages follow the cursor with no repeats;
// too long, too many terms and a bad cursor get their codes, on the
// WebSocket and over /v1/rpc (an error frame, as every /v1/rpc answer).
func TestSearchPagingAndBadQueries(t *testing.T) {
	srv := servertest.Start(t)
	alice := dialRaw(t, srv, "alice", "phone")
	conv := alice.createGroup("pages", "bob")
	var all []uint64
	for i := range 25 {
		all = append(all, mustOK(t, alice.sendText(conv, cmid(i), "分页测试 page "+itoa(i)), protocol.TypeAck).Seq)
	}
	alice.waitFound("分页测试", all...)
	var got []uint64
	cursor := ""
	for pages := 0; ; pages++ {
		f := mustOK(t, alice.search(protocol.SearchQuery{Text: "分页", Limit: 10, Cursor: cursor}), protocol.TypeSearch)
		for _, h := range f.Search.Hits {
			got = append(got, h.Seq)
		}
		if f.Search.Cursor == "" {
			if pages != 2 {
				t.Fatalf("%d pages", pages+1)
			}
			break
		}
		cursor = f.Search.Cursor
	}
	if !slices.IsSortedFunc(got, func(a, b uint64) int { return int(b) - int(a) }) || len(got) != 25 {
		t.Fatalf("pages: %v", got)
	}

	bad := []struct {
		q    protocol.SearchQuery
		code protocol.Code
	}{
		{protocol.SearchQuery{Text: strings.Repeat("长", 100)}, protocol.CodeQueryTooLong},
		{protocol.SearchQuery{Text: strings.Repeat("a ", 17)}, protocol.CodeQueryTooComplex},
		{protocol.SearchQuery{Text: "分页", Cursor: "not-a-cursor"}, protocol.CodeBadCursor},
		{protocol.SearchQuery{Text: "分页", Cursor: cursor, Order: protocol.OrderRelevance}, protocol.CodeBadCursor},
		{protocol.SearchQuery{Text: "...."}, protocol.CodeInvalidArgument},
		{protocol.SearchQuery{Text: "x", FromSeq: 3}, protocol.CodeInvalidArgument},
		{protocol.SearchQuery{Text: "x", Limit: 1000}, protocol.CodeInvalidArgument},
	}
	p := &pollClient{t: t, base: srv.HTTPURL, token: srv.Token("alice"), device: "web"}
	for _, b := range bad {
		if f := alice.search(b.q); f.Type != protocol.TypeError || f.Code != b.code {
			t.Errorf("ws %+v: %s %s, want %s", b.q, f.Type, f.Code, b.code)
		}
		data, _ := json.Marshal(protocol.Frame{Type: protocol.TypeSearch, Query: &b.q})
		st, body := p.do("POST", "/v1/rpc?device=web", data)
		var f protocol.Frame
		if json.Unmarshal(body, &f) != nil || f.Type != protocol.TypeError || f.Code != b.code || st != http.StatusOK {
			t.Errorf("rpc %+v: %d %s", b.q, st, body)
		}
	}
	// Over /v1/rpc a good query is answered like on the WebSocket.
	data, _ := json.Marshal(protocol.Frame{Type: protocol.TypeSearch, Query: &protocol.SearchQuery{Text: "page 7"}})
	st, body := p.do("POST", "/v1/rpc?device=web", data)
	var f protocol.Frame
	if st != http.StatusOK || json.Unmarshal(body, &f) != nil || f.Type != protocol.TypeSearch || len(f.Search.Hits) != 1 {
		t.Fatalf("rpc search: %d %s", st, body)
	}
}
