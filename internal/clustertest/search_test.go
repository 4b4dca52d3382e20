package clustertest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/search/opensearch"
	"github.com/parley-im/parley/protocol"
)

// TestClusterSearch: with search.opensearch_url, the chat processes index
// what is sent into OpenSearch and answer search from it through any
// gateway: a member finds a Chinese and an English phrase, a non-member
// nothing; an edit replaces the text found.
func TestClusterSearch(t *testing.T) {
	urls := enginetest.OpenSearch(t).URLs
	c := Start(t, Options{Gateways: 2, Chats: 2, Extra: []string{"--search.opensearch-url", urls[0]}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := opensearch.Drop(ctx, opensearch.Config{URLs: urls, Prefix: c.keyspace + "-search"}); err != nil {
			t.Logf("drop the cluster's indexes: %v", err)
		}
	})
	alice := dial(t, c, c.Gateways[0], "alice", "phone")
	bob := dial(t, c, c.Gateways[1], "bob", "phone")
	carol := dial(t, c, c.Gateways[1], "carol", "phone")
	conv := must(t, alice.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}), protocol.TypeConv).Conv.ConvID
	send := func(id, body string) uint64 {
		return must(t, alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Body: body}), protocol.TypeAck).Seq
	}
	report := send("a", "the quarterly report 季度报告 is ready")
	lunch := send("b", "lunch at noon 中午吃饭")
	find := func(w *ws, text string) []uint64 {
		f := must(t, w.call(protocol.Frame{Type: protocol.TypeSearch, Query: &protocol.SearchQuery{Text: text, Limit: 10}}), protocol.TypeSearch)
		var seqs []uint64
		for _, h := range f.Search.Hits {
			seqs = append(seqs, h.Seq)
		}
		slices.Sort(seqs)
		return seqs
	}
	wait := func(w *ws, text string, want ...uint64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := find(w, text)
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("search %q: %v, want %v", text, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	wait(bob, "季度报告", report)
	wait(bob, "Quarterly Report", report)
	wait(alice, "吃饭", lunch)
	if got := find(carol, "季度报告"); len(got) != 0 {
		t.Fatalf("a non-member found %v", got)
	}
	must(t, alice.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: conv, ClientMsgID: "c", TargetSeq: report, Body: "the annual budget 年度预算"}), protocol.TypeAck)
	wait(bob, "年度预算", report)
	wait(bob, "季度报告")
}
