package clustertest

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/protocol"
)

// privateOpenSearch is a single-node OpenSearch of the test's own
// (scripts/engines/opensearch.sh on free ports, a directory of its own),
// which the test may stop and start without disturbing the shared node.
type privateOpenSearch struct {
	t   *testing.T
	dir string
	env []string
	URL string
}

func startPrivateOpenSearch(t *testing.T) *privateOpenSearch {
	t.Helper()
	enginetest.OpenSearch(t) // the shared node's script installed the distribution this one reuses
	// Under root the script runs the node as nobody, who must reach its
	// directory: not under t.TempDir's 0700 parents.
	dir, err := os.MkdirTemp("", "parley-private-opensearch-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	port := freePorts(t, 2) // HTTP, transport the next
	o := &privateOpenSearch{t: t, dir: dir, URL: "http://127.0.0.1:" + strconv.Itoa(port)}
	o.env = append(os.Environ(), "PARLEY_ENGINES_DIR="+dir, "PARLEY_OPENSEARCH_PORT="+strconv.Itoa(port),
		"PARLEY_OPENSEARCH_TRANSPORT_PORT="+strconv.Itoa(port+1), "PARLEY_OPENSEARCH_HEAP=384m",
		// Its shards recover before it is green again: minutes under load.
		"PARLEY_OPENSEARCH_START_TIMEOUT=600")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "opensearch", "stdout.log"))
			t.Logf("--- private OpenSearch stdout.log ---\n%s", tail(string(b), 3000))
		}
		o.kill()
		os.RemoveAll(dir)
	})
	o.script("start")
	return o
}

// script runs opensearch.sh ACTION on the private node.
func (o *privateOpenSearch) script(action string) time.Duration {
	o.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "../../scripts/engines/opensearch.sh", action)
	cmd.Env = o.env
	if out, err := cmd.CombinedOutput(); err != nil {
		o.t.Fatalf("opensearch.sh %s: %v\n%s", action, err, out)
	}
	return time.Since(start)
}

// kill ends the node with SIGKILL (nothing if it is not running).
func (o *privateOpenSearch) kill() {
	killPidFile(filepath.Join(o.dir, "opensearch", "opensearch.pid"))
}

// metric sums a metric's value over the chat processes: name is the
// series as /metrics writes it, labels included (`x_bucket{le="10"}`).
func metric(t *testing.T, c *Cluster, name string) float64 {
	t.Helper()
	var sum float64
	client := http.Client{Timeout: 5 * time.Second}
	for _, p := range c.Chats {
		resp, err := client.Get("http://" + p.Addr + "/metrics")
		if err != nil {
			t.Fatalf("metrics of %s: %v", p.Name, err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("metric %s of %s: %q", name, p.Name, v)
				}
				sum += f
			}
		}
		resp.Body.Close()
	}
	return sum
}

// TestClusterSearchOpenSearchOutage: the cluster's OpenSearch (a private
// node) is stopped while messages are sent: every send is acknowledged as
// usual, search answers search_unavailable, the indexer's pending
// conversations and failures show the lag; after OpenSearch is started
// again every message is found, each once (the index holds exactly the
// conversation's messages), and the lag histogram holds every message
// sent during the outage above the outage's length.
func TestClusterSearchOpenSearchOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an OpenSearch node of its own")
	}
	node := startPrivateOpenSearch(t)
	c := Start(t, Options{Gateways: 1, Chats: 2, Extra: []string{"--search.opensearch-url", node.URL},
		MigrateTimeout: 5 * time.Minute}) // it runs long anyway: do not fail on a loaded Cassandra
	x := searchIndex(t, c, []string{node.URL})
	alice := dial(t, c, c.Gateways[0], "alice", "phone")
	group := must(t, alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "outage", Members: []string{"bob", "carol"}}), protocol.TypeConv).Conv.ConvID
	direct := must(t, alice.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}), protocol.TypeConv).Conv.ConvID
	send := func(conv uint64, id, body string) uint64 {
		return must(t, alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: id, Body: body}), protocol.TypeAck).Seq
	}
	var before []uint64
	for i := range 5 {
		before = append(before, send(group, fmt.Sprint("b", i), fmt.Sprintf("before the outage 停机之前 %d", i)))
	}
	waitFound(alice, "停机之前", before...)

	t.Logf("OpenSearch stopped in %v", node.script("stop").Round(time.Millisecond))
	stopped := time.Now()
	const during = 20
	var groupSeqs, directSeqs []uint64
	for i := range during {
		conv := group
		if i%2 == 1 {
			conv = direct
		}
		seq := send(conv, fmt.Sprint("d", i), fmt.Sprintf("sent during the outage 停机期间 %d", i))
		if conv == group {
			groupSeqs = append(groupSeqs, seq)
		} else {
			directSeqs = append(directSeqs, seq)
		}
	}
	t.Logf("%d sends acknowledged with OpenSearch down, in %v", during, time.Since(stopped).Round(time.Millisecond))
	if f := alice.call(protocol.Frame{Type: protocol.TypeSearch, Query: &protocol.SearchQuery{Text: "停机"}}); f.Type != protocol.TypeError || f.Code != protocol.CodeSearchUnavailable {
		t.Fatalf("search with OpenSearch down: %s %s, want error %s", f.Type, f.Code, protocol.CodeSearchUnavailable)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		pending, failures := metric(t, c, "parley_search_pending_conversations"), metric(t, c, "parley_search_index_failures_total")
		if pending >= 2 && failures > 0 {
			t.Logf("with OpenSearch down: %v conversations pending, %v failed rounds", pending, failures)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with OpenSearch down: %v conversations pending, %v failed rounds; want 2 and some", pending, failures)
		}
	}
	// An outage of at least 10 s, so that its messages' lag shows above
	// the histogram's 10 s bucket.
	time.Sleep(time.Until(stopped.Add(10 * time.Second)))
	t.Logf("OpenSearch started again in %v", node.script("start").Round(time.Millisecond))
	restarted := time.Now()

	waitFound(alice, "停机期间", append(slices.Clone(groupSeqs), directSeqs...)...)
	waitFound(alice, "停机之前", before...)
	t.Logf("every message found %v after OpenSearch was back", time.Since(restarted).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for conv, want := range map[uint64]int{group: len(before) + len(groupSeqs), direct: len(directSeqs)} {
		if n, err := x.Count(ctx, conv); err != nil || n != uint64(want) {
			t.Fatalf("conversation %d: %d documents (%v), want %d", conv, n, err, want)
		}
	}
	total := metric(t, c, "parley_search_index_lag_seconds_count")
	under10 := metric(t, c, `parley_search_index_lag_seconds_bucket{le="10"}`)
	if total != float64(len(before)+during) || total-under10 < during {
		t.Fatalf("lag histogram: %v messages, %v within 10 s; want %d, of which the %d sent during the outage above 10 s",
			total, under10, len(before)+during, during)
	}
	if n := metric(t, c, "parley_search_pending_conversations"); n != 0 {
		t.Fatalf("%v conversations still pending", n)
	}
}

// TestClusterSearchKill9: chat processes are killed with SIGKILL in turn
// during a send storm and started again; afterwards every stored message
// is found by search in OpenSearch, each once: what a dead process had
// noted and not indexed is indexed by the partition's next owner from the
// watermarks.
func TestClusterSearchKill9(t *testing.T) {
	urls := enginetest.OpenSearch(t).URLs
	c := Start(t, Options{Gateways: 2, Chats: 2, Extra: []string{"--search.opensearch-url", urls[0]}})
	x := searchIndex(t, c, urls)
	s := startRawStorm(t, c, 6)
	for _, p := range c.Chats {
		time.Sleep(1500 * time.Millisecond)
		c.Kill9(p)
		time.Sleep(1500 * time.Millisecond)
		c.Restart(p)
	}
	time.Sleep(time.Second)
	s.finish()
	hist := histories(t, c, s.cs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	total := 0
	for conv, msgs := range hist {
		var want []uint64
		for _, m := range msgs {
			if m.Kind == protocol.KindText {
				want = append(want, m.Seq)
			}
		}
		total += len(want)
		w := dial(t, c, c.Gateways[0], s.cs.members[conv][0], "search")
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got := searchAll(w, conv, "says")
			if slices.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("conversation %d: search finds %d of %d stored messages (first missing %v)", conv, len(got), len(want), firstMissing(want, got))
			}
		}
		if n, err := x.Count(ctx, conv); err != nil || n != uint64(len(want)) {
			t.Fatalf("conversation %d: %d documents (%v), want %d", conv, n, err, len(want))
		}
	}
	t.Logf("%d stored messages in %d conversations, every one found once after 2 kills", total, len(hist))
}

// searchAll pages through every hit of text in conv, failing on a seq
// seen twice; the seqs sorted.
func searchAll(w *ws, conv uint64, text string) []uint64 {
	w.t.Helper()
	var seqs []uint64
	seen := map[uint64]bool{}
	for cursor := ""; ; {
		f := must(w.t, w.call(protocol.Frame{Type: protocol.TypeSearch, Query: &protocol.SearchQuery{Text: text, ConvID: conv, Limit: 100, Cursor: cursor}}), protocol.TypeSearch)
		for _, h := range f.Search.Hits {
			if seen[h.Seq] {
				w.t.Fatalf("conversation %d: seq %d found twice", conv, h.Seq)
			}
			seen[h.Seq] = true
			seqs = append(seqs, h.Seq)
		}
		if cursor = f.Search.Cursor; cursor == "" {
			break
		}
	}
	slices.Sort(seqs)
	return seqs
}

func firstMissing(want, got []uint64) []uint64 {
	var out []uint64
	for _, s := range want {
		if _, ok := slices.BinarySearch(got, s); !ok && len(out) < 10 {
			out = append(out, s)
		}
	}
	return out
}
