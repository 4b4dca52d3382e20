package crashtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// TestKill9SearchCatchUp kills the server with SIGKILL while clients send
// to a group, restarts it, and checks that every acknowledged message is
// found by search afterwards: what the indexer had only noted in memory
// when the process died is indexed from the watermarks at the next start.
func TestKill9SearchCatchUp(t *testing.T) {
	if testing.Short() {
		t.Skip("crash cycles take ~10s")
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	n := &node{t: t, addr: freeAddr(t), dataDir: t.TempDir(), keyHex: hex.EncodeToString(key)}
	n.start()
	names := []string{"u0", "u1", "u2", "u3"}
	admin, err := n.dial("u0")
	if err != nil {
		t.Fatal(err)
	}
	group, err := admin.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "search", Members: names[1:]})
	if err != nil || group.Type != protocol.TypeConv {
		t.Fatalf("create group: %v %+v", err, group)
	}
	admin.ws.Close()
	conv := group.Conv.ConvID

	got := &acked{seqs: make(map[uint64]map[uint64]string)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, u := range names {
		wg.Add(1)
		go func() { defer wg.Done(); sender(ctx, n, u, []uint64{conv}, got, stop) }()
	}
	for range 3 {
		time.Sleep(1200 * time.Millisecond)
		n.kill9()
		time.Sleep(100 * time.Millisecond)
		n.start()
	}
	close(stop)
	wg.Wait()
	// The last cycle: kill right after the sends, before the index is
	// written, then start again.
	n.kill9()
	n.start()
	if got.err != nil {
		t.Fatal(got.err)
	}
	want := got.seqs[conv]
	if len(want) < 50 {
		t.Fatalf("only %d messages acknowledged", len(want))
	}
	c, err := n.dial("u1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.ws.Close()
	var missing []uint64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		found := map[uint64]bool{}
		cursor := ""
		for {
			r, err := c.call(protocol.Frame{Type: protocol.TypeSearch, Query: &protocol.SearchQuery{Text: "says", ConvID: conv, Limit: 100, Cursor: cursor}})
			if err != nil || r.Type != protocol.TypeSearch {
				t.Fatalf("search: %v %+v", err, r)
			}
			for _, h := range r.Search.Hits {
				found[h.Seq] = true
			}
			if cursor = r.Search.Cursor; cursor == "" {
				break
			}
		}
		missing = missing[:0]
		for seq := range want {
			if !found[seq] {
				missing = append(missing, seq)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acknowledged messages never found by search: %v", len(missing), len(want), missing[:min(10, len(missing))])
		}
	}
	// And by their own words.
	for seq, cmid := range want {
		var user string
		var i int
		fmt.Sscanf(cmid, "u%1s-%d", &user, &i)
		r, err := c.call(protocol.Frame{Type: protocol.TypeSearch, Query: &protocol.SearchQuery{Text: fmt.Sprintf("u%s says %d", user, i), ConvID: conv}})
		if err != nil || r.Type != protocol.TypeSearch || len(r.Search.Hits) != 1 || r.Search.Hits[0].Seq != seq {
			t.Fatalf("search for %s: %v %+v", cmid, err, r)
		}
		break
	}
	n.stop()
}
