package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/servertest"
)

// TestSearchReindexCommand: `parley search reindex` rebuilds a running
// node's lost index through the server API, of one conversation and of
// all, drawing its bar to done; a node without the API or with another
// key is refused with the reason.
func TestSearchReindexCommand(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	ctx := context.Background()
	post := func(path string, body any, out any) {
		t.Helper()
		data, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, srv.AdminURL+path, bytes.NewReader(data))
		req.Header.Set("Authorization", "Bearer "+srv.AdminKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	var convs []uint64
	for g := range 3 {
		var ans struct {
			Conv struct {
				ConvID uint64 `json:"conv_id,string"`
			} `json:"conv"`
		}
		post("/v1/admin/conversations/group", map[string]any{"owner": "alice", "name": fmt.Sprint("g", g), "members": []string{"bob"}}, &ans)
		convs = append(convs, ans.Conv.ConvID)
		for i := range 5 {
			var ack map[string]any
			post("/v1/admin/conversations/"+strconv.FormatUint(ans.Conv.ConvID, 10)+"/messages",
				map[string]any{"as": "user", "sender": "alice", "client_msg_id": fmt.Sprint("m", i), "body": fmt.Sprint("重建索引 message ", i)}, &ack)
		}
	}
	_, ix := srv.Search()
	count := func(conv uint64) uint64 {
		n, err := ix.Count(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitCount := func(conv, want uint64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for count(conv) != want {
			if time.Now().After(deadline) {
				t.Fatalf("conversation %d: %d documents, want %d", conv, count(conv), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var lose search.Batch
	for _, c := range convs {
		waitCount(c, 5)
		for seq := uint64(1); seq <= 10; seq++ {
			lose.Delete = append(lose.Delete, search.Key{ConvID: c, Seq: seq})
		}
	}
	if err := ix.Apply(ctx, lose); err != nil {
		t.Fatal(err)
	}
	adminArgs := []string{"--admin.listen", strings.TrimPrefix(srv.AdminURL, "http://"), "--admin.key", srv.AdminKey}
	var bar bytes.Buffer
	if err := runSearch(ctx, append([]string{"reindex", "-conv", strconv.FormatUint(convs[0], 10)}, adminArgs...), &bar); err != nil {
		t.Fatal(err)
	}
	if count(convs[0]) != 5 || count(convs[1]) != 0 {
		t.Fatalf("after reindexing one conversation: %d and %d documents, want 5 and 0", count(convs[0]), count(convs[1]))
	}
	if !strings.Contains(bar.String(), "100%") || !strings.Contains(bar.String(), "1/1 conversations done") {
		t.Fatalf("bar %q does not end at 100%% of 1 conversation", bar.String())
	}
	bar.Reset()
	if err := runSearch(ctx, append([]string{"reindex"}, adminArgs...), &bar); err != nil {
		t.Fatal(err)
	}
	for _, c := range convs {
		if count(c) != 5 {
			t.Fatalf("after reindexing all: conversation %d has %d documents, want 5", c, count(c))
		}
	}
	if !strings.Contains(bar.String(), "3/3 conversations done") {
		t.Fatalf("bar %q does not end at 3 conversations", bar.String())
	}
	if err := runSearch(ctx, append([]string{"reindex", "-conv", "999"}, adminArgs...), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("reindex of no conversation = %v, want not_found", err)
	}
	if err := runSearch(ctx, []string{"reindex"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "server API is off") {
		t.Fatalf("reindex without admin.listen = %v", err)
	}
	bad := append([]string{}, adminArgs...)
	bad[3] = hex.EncodeToString(make([]byte, 32))
	if err := runSearch(ctx, append([]string{"reindex"}, bad...), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("reindex with a wrong key = %v", err)
	}
	if err := runSearch(ctx, []string{"compact"}, &bytes.Buffer{}); err == nil {
		t.Fatal("an unknown subcommand was accepted")
	}
}
