package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/parley-im/parley/internal/admin"
	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

type searchAns struct {
	Search protocol.SearchResult `json:"search"`
}

func hitSeqs(r protocol.SearchResult) []uint64 {
	var seqs []uint64
	for _, h := range r.Hits {
		seqs = append(seqs, h.Seq)
	}
	slices.Sort(seqs)
	return seqs
}

// reindex calls the reindex endpoint and returns its lines.
func (a *adminClient) reindex(body any) []admin.ReindexLine {
	a.t.Helper()
	status, data := a.raw(a.key, http.MethodPost, "/v1/admin/search/reindex", body)
	if status != http.StatusOK {
		a.t.Fatalf("reindex: %d %s", status, data)
	}
	var lines []admin.ReindexLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var l admin.ReindexLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			a.t.Fatalf("reindex line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		a.t.Fatal("reindex: no lines")
	}
	return lines
}

// TestAdminSearchAndReindex: the server API searches as a user (within the
// user's membership windows, as the user's own search frame) or one
// conversation whole; refuses a search that names neither; and rebuilds a
// lost index, of one conversation or of all, while the node serves.
func TestAdminSearchAndReindex(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	a := newAdmin(t, srv)
	alice := dialRaw(t, srv, "alice", "phone")
	conv := alice.createGroup("ops", "bob")
	other := alice.createGroup("other", "bob")
	seq := func(f *protocol.Frame) uint64 { return mustOK(t, f, protocol.TypeAck).Seq }
	s1 := seq(alice.sendText(conv, "m1", "部署在周五 deploy friday"))
	o1 := seq(alice.sendText(other, "o1", "部署 elsewhere"))
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: conv, Members: []string{"bob"}}), protocol.TypeConv)
	s2 := seq(alice.sendText(conv, "m2", "部署 after bob left"))
	alice.waitFound("部署", s1, s2, o1)

	var ans searchAns
	a.ok(http.MethodPost, "/v1/admin/search", map[string]any{"user_id": "bob", "query": map[string]any{"text": "部署", "conv_id": u64(conv)}}, &ans)
	if got := hitSeqs(ans.Search); !slices.Equal(got, []uint64{s1}) {
		t.Fatalf("as bob in conv: %v, want [%d] (nothing after his leave)", got, s1)
	}
	a.ok(http.MethodPost, "/v1/admin/search", map[string]any{"query": map[string]any{"text": "部署", "conv_id": u64(conv)}}, &ans)
	if got := hitSeqs(ans.Search); !slices.Equal(got, []uint64{s1, s2}) {
		t.Fatalf("the operator in conv: %v, want [%d %d]", got, s1, s2)
	}
	if len(ans.Search.Hits[0].Highlights) == 0 || ans.Search.Hits[0].Snippet == "" {
		t.Fatalf("hit without snippet or highlights: %+v", ans.Search.Hits[0])
	}
	a.fails(http.MethodPost, "/v1/admin/search", map[string]any{"query": map[string]any{"text": "部署"}}, 400, protocol.CodeInvalidArgument)
	a.fails(http.MethodPost, "/v1/admin/search", map[string]any{"user_id": "carol", "query": map[string]any{"text": "部署", "conv_id": u64(conv)}}, 403, protocol.CodeNotMember)
	a.fails(http.MethodPost, "/v1/admin/search", map[string]any{"user_id": "bob", "query": map[string]any{"text": ""}}, 400, protocol.CodeInvalidArgument)
	a.fails(http.MethodPost, "/v1/admin/search", map[string]any{"user_id": "bob", "query": map[string]any{"text": "x", "cursor": "nonsense"}}, 400, protocol.CodeBadCursor)
	a.fails(http.MethodPost, "/v1/admin/search", `{"query":{"text":"x"},"extra":1}`, 400, protocol.CodeBadFrame)

	// Lose the index of both conversations, then rebuild one, then all.
	_, ix := srv.Search()
	if err := ix.Apply(context.Background(), search.Batch{Delete: []search.Key{{ConvID: conv, Seq: s1}, {ConvID: conv, Seq: s2}, {ConvID: other, Seq: o1}}}); err != nil {
		t.Fatal(err)
	}
	alice.waitFound("部署")
	lines := a.reindex(map[string]any{"conv_id": u64(conv)})
	last := lines[len(lines)-1]
	if last.Done == nil || last.Done.Conversations != 1 || last.Done.Messages < 3 {
		t.Fatalf("reindex of one conversation ended %+v, want done with 1 conversation and its messages", last)
	}
	alice.waitFound("部署", s1, s2)
	lines = a.reindex(nil)
	if last = lines[len(lines)-1]; last.Done == nil || last.Done.Conversations != 2 {
		t.Fatalf("reindex of everything ended %+v, want done with 2 conversations", last)
	}
	if lines[0].Progress == nil {
		t.Fatalf("the stream does not start with progress: %+v", lines[0])
	}
	alice.waitFound("部署", s1, s2, o1)
	lines = a.reindex(map[string]any{"conv_id": "12345"})
	if last = lines[len(lines)-1]; last.Error == nil || last.Error.Code != protocol.CodeNotFound {
		t.Fatalf("reindex of no conversation ended %+v, want error not_found", last)
	}
	status, _ := a.raw(a.key, http.MethodPost, "/v1/admin/search/reindex", map[string]any{"conv_id": "x"})
	if status != http.StatusBadRequest {
		t.Fatalf("reindex of conv_id x: %d, want 400", status)
	}
}
