// Package searchtest is the conformance suite of search.Index. Every
// engine runs it unchanged (Run): phrases in English and Chinese, replace
// and delete, the windows, the filters, both orders, paging and cursors,
// watermarks, reopening, and concurrent use (run it with -race).
package searchtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/search"
)

// Harness opens indexes for the suite.
type Harness struct {
	// Open returns a new, empty index.
	Open func(t *testing.T) search.Index
	// Reopen closes x and opens the same data again (the Reopen subtest
	// skips without it).
	Reopen func(t *testing.T, x search.Index) search.Index
}

type env struct {
	h   Harness
	x   search.Index
	ctx context.Context
}

// Run runs the suite; each subtest gets a fresh index.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"PhraseEnglish", testPhraseEnglish},
		{"PhraseChinese", testPhraseChinese},
		{"Mixed", testMixed},
		{"Replace", testReplace},
		{"Delete", testDelete},
		{"Windows", testWindows},
		{"ManyWindows", testManyWindows},
		{"Filters", testFilters},
		{"Newest", testNewest},
		{"Relevance", testRelevance},
		{"Paging", testPaging},
		{"BadCursor", testBadCursor},
		{"Watermarks", testWatermarks},
		{"Count", testCount},
		{"Reopen", testReopen},
		{"Concurrent", testConcurrent},
		{"Labelled", testLabelled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e := &env{h: h, x: h.Open(t), ctx: ctx}
			defer func() { e.x.Close() }()
			tc.fn(t, e)
		})
	}
}

// base is the server time of the suite's first document.
const base = int64(1_790_000_000_000)

func doc(conv, seq uint64, text string) search.Doc {
	return search.Doc{ConvID: conv, Seq: seq, MsgID: conv<<20 | seq, Sender: "alice", Time: base + int64(seq)*1000 + int64(conv), Kind: "text", Text: text}
}

func (e *env) put(t *testing.T, docs ...search.Doc) {
	t.Helper()
	if err := e.x.Apply(e.ctx, search.Batch{Put: docs}); err != nil {
		t.Fatal(err)
	}
}

func all(convs ...uint64) []search.Window {
	var ws []search.Window
	for _, c := range convs {
		ws = append(ws, search.Window{ConvID: c, From: 1})
	}
	return ws
}

// find runs a query of text over ws (newest first, one page of 100) and
// returns the keys of the hits.
func (e *env) find(t *testing.T, text string, ws []search.Window) []search.Key {
	t.Helper()
	return e.query(t, search.Query{Text: text, Windows: ws, Limit: 100})
}

func (e *env) query(t *testing.T, q search.Query) []search.Key {
	t.Helper()
	if err := search.Validate(q, search.DefaultLimits); err != nil {
		t.Fatalf("validate %+v: %v", q, err)
	}
	r, err := e.x.Search(e.ctx, q)
	if err != nil {
		t.Fatalf("search %+v: %v", q, err)
	}
	return keys(r.Hits)
}

func keys(hs []search.Hit) []search.Key {
	var ks []search.Key
	for _, h := range hs {
		ks = append(ks, search.Key{ConvID: h.ConvID, Seq: h.Seq})
	}
	return ks
}

func sorted(ks []search.Key) []search.Key {
	ks = slices.Clone(ks)
	slices.SortFunc(ks, func(a, b search.Key) int {
		if a.ConvID != b.ConvID {
			return cmpU(a.ConvID, b.ConvID)
		}
		return cmpU(a.Seq, b.Seq)
	})
	return ks
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func k(conv, seq uint64) search.Key { return search.Key{ConvID: conv, Seq: seq} }

// expect checks that text finds exactly want (in any order).
func (e *env) expect(t *testing.T, text string, ws []search.Window, want ...search.Key) {
	t.Helper()
	got := sorted(e.find(t, text, ws))
	want = sorted(want)
	if !slices.Equal(got, want) {
		t.Errorf("query %q: hits %v, want %v", text, got, want)
	}
}

func testPhraseEnglish(t *testing.T, e *env) {
	e.put(t,
		doc(1, 1, "The quick brown fox jumps over the lazy dog"),
		doc(1, 2, "brown quick"),
		doc(1, 3, "QUICK, Brown! said the fox."),
		doc(1, 4, "nothing to see here"),
	)
	ws := all(1)
	e.expect(t, "quick brown", ws, k(1, 1), k(1, 3))
	e.expect(t, "Quick Brown", ws, k(1, 1), k(1, 3))
	e.expect(t, "brown quick", ws, k(1, 2))
	e.expect(t, "fox", ws, k(1, 1), k(1, 3))
	e.expect(t, "lazy dog", ws, k(1, 1))
	e.expect(t, "lazy cat", ws)
	e.expect(t, "elephant", ws)
}

func testPhraseChinese(t *testing.T, e *env) {
	e.put(t,
		doc(1, 1, "我们明天去北京开会"),
		doc(1, 2, "北京烤鸭很好吃"),
		doc(1, 3, "南京的天气怎么样？"),
		doc(1, 4, "会议改到后天了，请大家准时参加。"),
		doc(1, 5, "中华人民共和国"),
	)
	ws := all(1)
	e.expect(t, "北京", ws, k(1, 1), k(1, 2))
	e.expect(t, "京", ws, k(1, 1), k(1, 2), k(1, 3))
	e.expect(t, "京开", ws, k(1, 1)) // across a word boundary: still an exact phrase
	e.expect(t, "明天去北京", ws, k(1, 1))
	e.expect(t, "北开", ws)
	e.expect(t, "天气", ws, k(1, 3))
	e.expect(t, "准时参加", ws, k(1, 4))
	e.expect(t, "人民共和国", ws, k(1, 5))
	e.expect(t, "共和", ws, k(1, 5))
	e.expect(t, "东京", ws)
}

func testMixed(t *testing.T, e *env) {
	e.put(t,
		doc(1, 1, "Parley 支持中文搜索 and English search"),
		doc(1, 2, "下午3点在Room 42开会"),
		doc(1, 3, "ＰＡＲＬＥＹ全角"),
	)
	ws := all(1)
	e.expect(t, "中文搜索", ws, k(1, 1))
	e.expect(t, "english search", ws, k(1, 1))
	e.expect(t, "parley", ws, k(1, 1), k(1, 3)) // full-width letters fold to ASCII
	e.expect(t, "ＲＯＯＭ", ws, k(1, 2))
	e.expect(t, "room 42", ws, k(1, 2))
	e.expect(t, "开会", ws, k(1, 2))
	e.expect(t, "全角", ws, k(1, 3))
}

func testReplace(t *testing.T, e *env) {
	e.put(t, doc(1, 1, "first draft about giraffes"), doc(1, 2, "giraffes again"))
	e.put(t, doc(1, 1, "final text about zebras 斑马"))
	ws := all(1)
	e.expect(t, "giraffes", ws, k(1, 2))
	e.expect(t, "zebras", ws, k(1, 1))
	e.expect(t, "斑马", ws, k(1, 1))
	// Putting the same document again changes nothing.
	e.put(t, doc(1, 1, "final text about zebras 斑马"))
	e.expect(t, "zebras", ws, k(1, 1))
}

func testDelete(t *testing.T, e *env) {
	e.put(t, doc(1, 1, "secret plans 秘密计划"), doc(1, 2, "public plans"), doc(2, 1, "secret too"))
	if err := e.x.Apply(e.ctx, search.Batch{Delete: []search.Key{k(1, 1), k(1, 9), k(7, 7)}}); err != nil {
		t.Fatal(err)
	}
	ws := all(1, 2)
	e.expect(t, "plans", ws, k(1, 2))
	e.expect(t, "秘密", ws)
	e.expect(t, "secret", ws, k(2, 1))
	// Put and delete of different keys in one batch.
	if err := e.x.Apply(e.ctx, search.Batch{Put: []search.Doc{doc(1, 3, "secret returns")}, Delete: []search.Key{k(2, 1)}}); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "secret", ws, k(1, 3))
}

func testWindows(t *testing.T, e *env) {
	var docs []search.Doc
	for c := uint64(1); c <= 3; c++ {
		for s := uint64(1); s <= 10; s++ {
			docs = append(docs, doc(c, s, fmt.Sprintf("meeting notes %d 会议记录", s)))
		}
	}
	e.put(t, docs...)
	// Only conversation 2, seqs 4 to 6 (a member who joined at 4 and left at 6).
	got := sorted(e.find(t, "meeting", []search.Window{{ConvID: 2, From: 4, To: 6}}))
	if want := []search.Key{k(2, 4), k(2, 5), k(2, 6)}; !slices.Equal(got, want) {
		t.Fatalf("window 2[4,6]: %v, want %v", got, want)
	}
	// A late joiner of conversation 1 (from 8) and all of conversation 3.
	got = sorted(e.find(t, "会议记录", []search.Window{{ConvID: 1, From: 8}, {ConvID: 3, From: 1}}))
	want := []search.Key{k(1, 8), k(1, 9), k(1, 10)}
	for s := uint64(1); s <= 10; s++ {
		want = append(want, k(3, s))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("windows 1[8,], 3[1,]: %v, want %v", got, want)
	}
	// No windows: nothing.
	r, err := e.x.Search(e.ctx, search.Query{Text: "meeting", Limit: 10})
	if err != nil || len(r.Hits) != 0 {
		t.Fatalf("no windows: %v %v", r, err)
	}
	// A full page from a window even when most hits lie outside it.
	got = e.query(t, search.Query{Text: "notes", Windows: []search.Window{{ConvID: 3, From: 2, To: 9}}, Limit: 5})
	if len(got) != 5 || slices.ContainsFunc(got, func(k search.Key) bool { return k.ConvID != 3 || k.Seq < 2 || k.Seq > 9 }) {
		t.Fatalf("page of 5 in 3[2,9]: %v", got)
	}
}

func testManyWindows(t *testing.T, e *env) {
	var docs []search.Doc
	for c := uint64(1); c <= 1500; c++ {
		docs = append(docs, doc(c, 1, "needle in conversation"), doc(c, 2, "hay"))
	}
	e.put(t, docs...)
	var ws []search.Window
	var want []search.Key
	for c := uint64(1); c <= 1500; c += 2 {
		ws = append(ws, search.Window{ConvID: c, From: 1})
		want = append(want, k(c, 1))
	}
	var got []search.Key
	cursor := ""
	for {
		q := search.Query{Text: "needle", Windows: ws, Limit: 100, Cursor: cursor}
		if err := search.Validate(q, search.DefaultLimits); err != nil {
			t.Fatal(err)
		}
		r, err := e.x.Search(e.ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, keys(r.Hits)...)
		if r.Next == "" {
			break
		}
		cursor = r.Next
	}
	if got = sorted(got); !slices.Equal(got, want) {
		t.Fatalf("750 windows: %d hits, want %d", len(got), len(want))
	}
}

func testFilters(t *testing.T, e *env) {
	d1 := doc(1, 1, "report attached 报告")
	d2 := doc(1, 2, "report draft 报告")
	d2.Sender = "bob"
	d3 := doc(1, 3, "quarterly report (pdf) 报告")
	d3.Kind = "file"
	d4 := doc(1, 4, "old report")
	d4.Time = base - 86_400_000
	e.put(t, d1, d2, d3, d4)
	ws := all(1)
	q := func(f func(*search.Query)) []search.Key {
		qq := search.Query{Text: "report", Windows: ws, Limit: 10}
		f(&qq)
		return sorted(e.query(t, qq))
	}
	check := func(name string, got []search.Key, want ...search.Key) {
		t.Helper()
		if !slices.Equal(got, sorted(want)) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	check("sender bob", q(func(q *search.Query) { q.Sender = "bob" }), k(1, 2))
	check("sender alice", q(func(q *search.Query) { q.Sender = "alice" }), k(1, 1), k(1, 3), k(1, 4))
	check("sender nobody", q(func(q *search.Query) { q.Sender = "carol" }))
	check("kind file", q(func(q *search.Query) { q.Kind = "file" }), k(1, 3))
	check("from time", q(func(q *search.Query) { q.FromTime = base }), k(1, 1), k(1, 2), k(1, 3))
	check("to time", q(func(q *search.Query) { q.ToTime = base }), k(1, 4))
	check("time range", q(func(q *search.Query) { q.FromTime = d2.Time; q.ToTime = d3.Time }), k(1, 2), k(1, 3))
	check("all filters", q(func(q *search.Query) { q.Sender = "alice"; q.Kind = "text"; q.FromTime = base }), k(1, 1))
}

func testNewest(t *testing.T, e *env) {
	// Times out of seq order: the order is by time.
	a, b, c := doc(1, 1, "ordered hit"), doc(1, 2, "ordered hit"), doc(2, 1, "ordered hit")
	a.Time, b.Time, c.Time = base+300, base+100, base+200
	e.put(t, a, b, c)
	got := e.find(t, "ordered", all(1, 2))
	if want := []search.Key{k(1, 1), k(2, 1), k(1, 2)}; !slices.Equal(got, want) {
		t.Fatalf("newest first: %v, want %v", got, want)
	}
}

func testRelevance(t *testing.T, e *env) {
	long := "the weekly report covers many things: budgets, hiring, travel, offices, vendors, contracts, and somewhere in the middle a red apple, then more budgets, hiring and travel"
	e.put(t, doc(1, 1, long), doc(1, 2, "red apple"), doc(1, 3, long+" again"))
	r, err := e.x.Search(e.ctx, search.Query{Text: "red apple", Windows: all(1), Limit: 10, Order: search.Relevance})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Hits) != 3 || keys(r.Hits)[0] != k(1, 2) {
		t.Fatalf("relevance: %v, want %v first", keys(r.Hits), k(1, 2))
	}
	for i := 1; i < len(r.Hits); i++ {
		if r.Hits[i].Score > r.Hits[i-1].Score {
			t.Fatalf("scores rise: %+v", r.Hits)
		}
	}
	// Newest first puts the short one (seq 2) after seq 3.
	if got := e.find(t, "red apple", all(1)); !slices.Equal(got, []search.Key{k(1, 3), k(1, 2), k(1, 1)}) {
		t.Fatalf("newest: %v", got)
	}
}

func testPaging(t *testing.T, e *env) {
	var docs []search.Doc
	for s := uint64(1); s <= 25; s++ {
		d := doc(1, s, fmt.Sprintf("page item %d 分页", s))
		if s%5 == 0 {
			d.Time = base // ties in time
		}
		docs = append(docs, d)
	}
	e.put(t, docs...)
	for _, o := range []search.Order{search.Newest, search.Relevance} {
		var got []search.Key
		cursor, pages := "", 0
		for {
			q := search.Query{Text: "分页", Windows: all(1), Limit: 10, Order: o, Cursor: cursor}
			if err := search.Validate(q, search.DefaultLimits); err != nil {
				t.Fatal(err)
			}
			r, err := e.x.Search(e.ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			got = append(got, keys(r.Hits)...)
			if r.Next == "" {
				break
			}
			if len(r.Hits) != 10 {
				t.Fatalf("order %d: a page of %d before the last", o, len(r.Hits))
			}
			cursor = r.Next
		}
		if pages != 3 || len(got) != 25 || len(sorted(slices.Compact(sorted(got)))) != 25 {
			t.Fatalf("order %d: %d pages, hits %v", o, pages, got)
		}
		if o == search.Newest && (got[0] != k(1, 24) || got[24] != k(1, 5)) {
			t.Fatalf("newest pages: %v", got)
		}
	}
	// An exact page: no cursor after the last.
	r, err := e.x.Search(e.ctx, search.Query{Text: "item", Windows: all(1), Limit: 25})
	if err != nil || len(r.Hits) != 25 || r.Next != "" {
		t.Fatalf("exact page: %d hits, next %q, %v", len(r.Hits), r.Next, err)
	}
}

func testBadCursor(t *testing.T, e *env) {
	e.put(t, doc(1, 1, "cursor test"), doc(1, 2, "cursor test"))
	r, err := e.x.Search(e.ctx, search.Query{Text: "cursor", Windows: all(1), Limit: 1})
	if err != nil || r.Next == "" {
		t.Fatalf("first page: %+v %v", r, err)
	}
	for _, c := range []string{"!!!", "bm90IGpzb24", search.EncodeCursor(search.Cursor{Order: search.Newest}),
		search.EncodeCursor(search.Cursor{Order: search.Newest, After: []string{"a", "b", "c", "d", "e"}})} {
		if _, err := e.x.Search(e.ctx, search.Query{Text: "cursor", Windows: all(1), Limit: 1, Cursor: c}); !errors.Is(err, search.ErrBadCursor) {
			t.Errorf("cursor %q: %v, want ErrBadCursor", c, err)
		}
	}
	// A cursor of the other order.
	if _, err := e.x.Search(e.ctx, search.Query{Text: "cursor", Windows: all(1), Limit: 1, Cursor: r.Next, Order: search.Relevance}); !errors.Is(err, search.ErrBadCursor) {
		t.Errorf("newest cursor in a relevance query: %v", err)
	}
}

func testWatermarks(t *testing.T, e *env) {
	if w, err := e.x.Watermark(e.ctx, 5); err != nil || w != 0 {
		t.Fatalf("no watermark: %d %v", w, err)
	}
	if err := e.x.Apply(e.ctx, search.Batch{Put: []search.Doc{doc(5, 3, "marked")}, Marks: map[uint64]uint64{5: 3, 6: 10}}); err != nil {
		t.Fatal(err)
	}
	if err := e.x.Apply(e.ctx, search.Batch{Marks: map[uint64]uint64{5: 2, 6: 11}}); err != nil {
		t.Fatal(err)
	}
	for conv, want := range map[uint64]uint64{5: 3, 6: 11, 7: 0} {
		if w, err := e.x.Watermark(e.ctx, conv); err != nil || w != want {
			t.Errorf("watermark %d: %d %v, want %d", conv, w, err, want)
		}
	}
}

func testCount(t *testing.T, e *env) {
	e.put(t, doc(1, 1, "a b"), doc(1, 2, "c"), doc(2, 1, "d"))
	for conv, want := range map[uint64]uint64{1: 2, 2: 1, 3: 0} {
		if n, err := e.x.Count(e.ctx, conv); err != nil || n != want {
			t.Errorf("count %d: %d %v, want %d", conv, n, err, want)
		}
	}
}

func testReopen(t *testing.T, e *env) {
	if e.h.Reopen == nil {
		t.Skip("no Reopen")
	}
	if err := e.x.Apply(e.ctx, search.Batch{Put: []search.Doc{doc(1, 1, "durable 持久")}, Marks: map[uint64]uint64{1: 1}}); err != nil {
		t.Fatal(err)
	}
	e.x = e.h.Reopen(t, e.x)
	e.expect(t, "持久", all(1), k(1, 1))
	if w, err := e.x.Watermark(e.ctx, 1); err != nil || w != 1 {
		t.Fatalf("watermark after reopen: %d %v", w, err)
	}
}

func testConcurrent(t *testing.T, e *env) {
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := uint64(1); g <= 4; g++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for s := uint64(1); s <= 20; s++ {
				if err := e.x.Apply(e.ctx, search.Batch{Put: []search.Doc{doc(g, s, "parallel 并行")}, Marks: map[uint64]uint64{g: s}}); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := e.x.Search(e.ctx, search.Query{Text: "并行", Windows: all(1, 2, 3, 4), Limit: 10}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := e.find(t, "parallel", all(1, 2, 3, 4))
	if len(got) != 80 {
		t.Fatalf("%d hits after concurrent writes, want 80", len(got))
	}
	for g := uint64(1); g <= 4; g++ {
		if w, err := e.x.Watermark(e.ctx, g); err != nil || w != 20 {
			t.Fatalf("watermark %d: %d %v", g, w, err)
		}
	}
}
