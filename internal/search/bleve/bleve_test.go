package bleve_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/search/bleve"
	"github.com/parley-im/parley/internal/search/searchtest"
)

func open(t *testing.T, dir string) search.Index {
	t.Helper()
	x, err := bleve.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestConformance(t *testing.T) { conformance(t) }

// TestConformanceSmallSteps runs the suite with newest-first queries
// stepping through the smallest time buckets, one a step.
func TestConformanceSmallSteps(t *testing.T) {
	defer bleve.SetStepDocs(1)()
	conformance(t)
}

func conformance(t *testing.T) {
	dirs := map[search.Index]string{}
	searchtest.Run(t, searchtest.Harness{
		Open: func(t *testing.T) search.Index {
			dir := filepath.Join(t.TempDir(), "search")
			x := open(t, dir)
			dirs[x] = dir
			return x
		},
		Reopen: func(t *testing.T, x search.Index) search.Index {
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
			y := open(t, dirs[x])
			dirs[y] = dirs[x]
			return y
		},
	})
}

// TestNewestAcrossBuckets pages newest-first through messages whose times
// lie in many time buckets of different sizes (seconds to years apart),
// after a reopen too, and with time bounds: every page continues exactly
// where the previous one ended, in time order, windows applied.
func TestNewestAcrossBuckets(t *testing.T) {
	for _, step := range []uint64{1, 8, 4096} {
		t.Run(fmt.Sprint("step", step), func(t *testing.T) {
			defer bleve.SetStepDocs(step)()
			testNewestAcrossBuckets(t)
		})
	}
}

func testNewestAcrossBuckets(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "search")
	x := open(t, dir)
	r := rand.New(rand.NewPCG(3, 4))
	const base = int64(1_790_000_000_000)
	var docs []search.Doc
	for i := range 300 {
		// Clusters of close times, far apart from one another.
		t := base - int64(r.IntN(6))*int64(1)<<(12+4*r.IntN(7)) - int64(r.IntN(5000))
		docs = append(docs, search.Doc{ConvID: uint64(1 + i%7), Seq: uint64(1 + i/7), Sender: "u", Kind: "text", Time: t, Text: "bucket hit"})
	}
	// Two at the same millisecond: the key orders them.
	docs[5].Time, docs[6].Time = docs[4].Time, docs[4].Time
	if err := x.Apply(ctx, search.Batch{Put: docs}); err != nil {
		t.Fatal(err)
	}
	ws := []search.Window{{ConvID: 1, From: 1}, {ConvID: 2, From: 10}, {ConvID: 3, From: 5, To: 30}}
	for c := uint64(4); c <= 30; c++ { // more windows than join the conjunction
		ws = append(ws, search.Window{ConvID: c + 100, From: 1})
	}
	in := func(d search.Doc, lo, hi int64) bool {
		if d.Time < lo || (hi != 0 && d.Time > hi) {
			return false
		}
		for _, w := range ws {
			if w.ConvID == d.ConvID && d.Seq >= w.From && (w.To == 0 || d.Seq <= w.To) {
				return true
			}
		}
		return false
	}
	check := func(t *testing.T, x search.Index, lo, hi int64) {
		var want []search.Key
		ds := slices.Clone(docs)
		slices.SortFunc(ds, func(a, b search.Doc) int {
			if a.Time != b.Time {
				return cmp.Compare(b.Time, a.Time)
			}
			return cmp.Or(cmp.Compare(b.ConvID, a.ConvID), cmp.Compare(b.Seq, a.Seq))
		})
		for _, d := range ds {
			if in(d, lo, hi) {
				want = append(want, search.Key{ConvID: d.ConvID, Seq: d.Seq})
			}
		}
		var got []search.Key
		cursor := ""
		for {
			res, err := x.Search(ctx, search.Query{Text: "bucket", Windows: ws, Limit: 3, Cursor: cursor, FromTime: lo, ToTime: hi})
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range res.Hits {
				got = append(got, search.Key{ConvID: h.ConvID, Seq: h.Seq})
			}
			if cursor = res.Next; cursor == "" {
				break
			}
			if len(res.Hits) != 3 {
				t.Fatalf("a page of %d before the last", len(res.Hits))
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("time %d..%d: got %d hits %v\nwant %d %v", lo, hi, len(got), got, len(want), want)
		}
	}
	check(t, x, 0, 0)
	check(t, x, base-int64(1)<<30, base-int64(1)<<14)
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	y := open(t, dir)
	defer y.Close()
	check(t, y, 0, 0)
}
