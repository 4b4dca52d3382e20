package opensearch_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/search/searchtest"
)

// TestBenchSearch measures the cluster engine on the node at
// PARLEY_TEST_OPENSEARCH (docs/benchmarks.md, "Search (cluster,
// OpenSearch)"): indexing throughput in Apply batches of 2,000 as the
// indexer writes them (bulk with refresh, then the watermarks), index
// bytes per message from _stats, and query latency for a user in 1,000
// conversations with the membership filter — the corpus of the embedded
// engine's benchmark (searchtest.BenchCorpus). It runs only with
// PARLEY_SEARCH_BENCH=N (messages).
func TestBenchSearch(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("PARLEY_SEARCH_BENCH"))
	if total == 0 {
		t.Skip("set PARLEY_SEARCH_BENCH=<messages> to run")
	}
	cfg := enginetest.OpenSearch(t)
	ctx := context.Background()
	x := open(t, cfg)
	defer x.Close()
	corpus := searchtest.NewBenchCorpus(5000, 2000)
	var applies []time.Duration
	start := time.Now()
	for {
		b := corpus.Next(total)
		if len(b.Put) == 0 {
			break
		}
		t0 := time.Now()
		if err := x.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
		applies = append(applies, time.Since(t0))
	}
	el := time.Since(start)
	slices.Sort(applies)
	t.Logf("indexed %d messages in %v: %.0f msgs/s (Apply of 2,000: p50 %v, p99 %v)", total, el.Round(time.Millisecond),
		float64(total)/el.Seconds(), applies[len(applies)/2].Round(time.Millisecond), applies[len(applies)*99/100].Round(time.Millisecond))
	for _, phase := range []string{"as indexed", "after a force merge to one segment"} {
		if phase != "as indexed" {
			post(t, cfg.URLs[0]+"/"+cfg.Prefix+"-messages/_forcemerge?max_num_segments=1")
		}
		post(t, cfg.URLs[0]+"/"+cfg.Prefix+"-messages/_flush")
		st := stats(t, cfg.URLs[0]+"/"+cfg.Prefix+"-messages/_stats/store,docs,segments")
		t.Logf("index %s: %d documents, %d segments, %d bytes: %.1f bytes/message (text %.1f bytes/message)", phase, st.Docs, st.Segments,
			st.Bytes, float64(st.Bytes)/float64(total), float64(corpus.TextBytes)/float64(total))
	}
	ws := corpus.Windows()
	var all []time.Duration
	for _, q := range searchtest.BenchQueries {
		var lat []time.Duration
		hits := 0
		for i := range 50 {
			o := search.Newest
			if i%2 == 1 {
				o = search.Relevance
			}
			t0 := time.Now()
			res, err := x.Search(ctx, search.Query{Text: q, Windows: ws, Limit: 20, Order: o})
			lat = append(lat, time.Since(t0))
			if err != nil {
				t.Fatal(err)
			}
			hits = len(res.Hits)
		}
		all = append(all, lat...)
		slices.Sort(lat)
		t.Logf("query %q over %d conversations: p50 %v p99 %v (page of %d)", q, len(ws), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond), hits)
	}
	slices.Sort(all)
	t.Logf("all %d queries: p50 %v p99 %v", len(all), all[len(all)/2].Round(time.Microsecond), all[len(all)*99/100].Round(time.Microsecond))
}

func post(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
}

type indexStats struct {
	Docs, Segments, Bytes int64
}

func stats(t *testing.T, url string) indexStats {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		All struct {
			Primaries struct {
				Docs     struct{ Count int64 } `json:"docs"`
				Segments struct{ Count int64 } `json:"segments"`
				Store    struct {
					Size int64 `json:"size_in_bytes"`
				} `json:"store"`
			} `json:"primaries"`
		} `json:"_all"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	p := r.All.Primaries
	return indexStats{Docs: p.Docs.Count, Segments: p.Segments.Count, Bytes: p.Store.Size}
}
