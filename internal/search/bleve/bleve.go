// Package bleve is the embedded search engine: a Bleve v2 (scorch) index
// in a directory of its own (data_dir/search on a node).
//
// A message is a document with id "<conv>:<seq>" (16 hex digits each, so
// ids sort as keys do) and these fields: `text`, indexed with positions by
// the text analyzer (analyzer.go: Unicode word segmentation, every CJK
// character a term of its own, width-folded, lower-cased, English stop
// words dropped), not stored; conv, sender and kind as keywords; and time
// (server time, 16 hex digits, so strings sort as times) as a keyword with
// doc values, which sorts and filters. A hit names a message, whose body
// the caller reads from the store.
//
// A query is the phrase on text under a filter, inside the engine's
// searcher, that reads each phrase match's id and time and keeps it only
// when it lies in one of the caller's windows (and the time range), before
// the collector sorts and counts it: the engine itself never returns
// what the windows exclude, and a thousand windows cost one map lookup a
// match instead of a thousand term searchers. With few windows their
// conversations' terms join the phrase in a conjunction, so the postings
// of other conversations are skipped.
//
// Watermarks are Bleve internal values ("w" + conv) set in the same batch
// as the documents. Batches are unsafe in scorch's sense: Apply returns
// once the batch is searchable, and scorch persists it in the background,
// each persisted snapshot holding a batch's documents with its watermarks,
// so a crash loses only whole batches from the end, which the indexer's
// catch-up reads again from the watermarks that survived. Close waits for
// what was applied to be persisted. The
// index layout's version is the internal value "layout": an index of
// another layout is removed at Open and built again (every watermark is
// then 0, so the indexer's catch-up reindexes the store).
package bleve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	blevesearch "github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/analysis/analyzer/keyword"
	"github.com/blevesearch/bleve/v2/index/scorch"
	"github.com/blevesearch/bleve/v2/mapping"
	bsearch "github.com/blevesearch/bleve/v2/search"
	"github.com/blevesearch/bleve/v2/search/query"
	"github.com/blevesearch/bleve/v2/search/searcher"
	index "github.com/blevesearch/bleve_index_api"

	"github.com/parley-im/parley/internal/search"
)

// Index is the Bleve engine.
type Index struct {
	idx blevesearch.Index
	// mu orders Apply (watermarks are read, raised and written) and
	// Close.
	mu     sync.RWMutex
	closed bool
	// unpersisted counts applied batches scorch has not yet persisted;
	// persisted is signalled as each one is.
	unpersisted atomic.Int64
	persisted   chan struct{}
	// newest is the highest time of a document ever put (0: none), where
	// a newest-first query starts.
	newest atomic.Int64
}

// runtime is scorch's configuration: see the package comment.
var runtime = map[string]any{"unsafe_batch": true}

// closeWait bounds how long Close waits for the applied batches to be
// persisted (a disk that keeps failing: the catch-up covers them).
const closeWait = 30 * time.Second

var _ search.Index = (*Index)(nil)

// layout is the version of the mapping below; an index of another is
// built again.
const layout = "2"

var layoutKey = []byte("layout")

// fewWindows is the most windows whose conversation terms join the
// phrase's conjunction; above it only the filter applies them.
const fewWindows = 16

func indexMapping() mapping.IndexMapping {
	im := blevesearch.NewIndexMapping()
	im.DefaultAnalyzer = keyword.Name
	im.StoreDynamic = false
	im.IndexDynamic = false
	im.DocValuesDynamic = false
	dm := blevesearch.NewDocumentStaticMapping()
	text := blevesearch.NewTextFieldMapping()
	text.Analyzer = textAnalyzer
	text.Store = false
	text.IncludeInAll = false
	text.IncludeTermVectors = true // positions: phrases
	text.DocValues = false
	kw := func(docValues bool) *mapping.FieldMapping {
		f := blevesearch.NewKeywordFieldMapping()
		f.Store = false
		f.IncludeInAll = false
		f.IncludeTermVectors = false
		f.DocValues = docValues
		return f
	}
	dm.AddFieldMappingsAt("text", text)
	dm.AddFieldMappingsAt("conv", kw(false))
	dm.AddFieldMappingsAt("sender", kw(false))
	dm.AddFieldMappingsAt("kind", kw(false))
	// Scorch keeps doc values only of indexed fields.
	dm.AddFieldMappingsAt("time", kw(true))
	// No norms for the buckets: only newest-first queries, which ignore
	// scores, read them.
	tb := kw(false)
	tb.SkipFreqNorm = true
	dm.AddFieldMappingsAt("tb", tb)
	im.DefaultMapping = dm
	return im
}

// Open opens the index in dir, creating it when there is none and
// building it again when it has another layout.
func Open(dir string) (*Index, error) {
	idx, err := blevesearch.OpenUsing(dir, runtime)
	if err == nil {
		v, gerr := idx.GetInternal(layoutKey)
		if gerr != nil {
			idx.Close()
			return nil, fmt.Errorf("bleve: open %s: %w", dir, gerr)
		}
		if string(v) != layout {
			idx.Close()
			if err := os.RemoveAll(dir); err != nil {
				return nil, fmt.Errorf("bleve: remove %s (layout %q): %w", dir, v, err)
			}
			err = blevesearch.ErrorIndexPathDoesNotExist
		}
	}
	if errors.Is(err, blevesearch.ErrorIndexPathDoesNotExist) {
		idx, err = blevesearch.NewUsing(dir, indexMapping(), scorch.Name, scorch.Name, runtime)
		if err == nil {
			if err = idx.SetInternal(layoutKey, []byte(layout)); err != nil {
				idx.Close()
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bleve: open %s: %w", dir, err)
	}
	x := &Index{idx: idx, persisted: make(chan struct{}, 1)}
	if err := x.loadNewest(); err != nil {
		idx.Close()
		return nil, fmt.Errorf("bleve: open %s: %w", dir, err)
	}
	return x, nil
}

func (x *Index) loadNewest() error {
	req := blevesearch.NewSearchRequestOptions(blevesearch.NewMatchAllQuery(), 1, 0, false)
	req.SortByCustom(bsearch.SortOrder{&bsearch.SortField{Field: "time", Type: bsearch.SortFieldAsString, Desc: true}})
	res, err := x.idx.Search(req)
	if err != nil {
		return err
	}
	if len(res.Hits) == 1 && len(res.Hits[0].Sort) == 1 {
		if u, err := strconv.ParseUint(res.Hits[0].Sort[0], 16, 63); err == nil {
			x.newest.Store(int64(u))
		}
	}
	return nil
}

func docID(k search.Key) string { return fmt.Sprintf("%016x:%016x", k.ConvID, k.Seq) }

func parseID(id string) (search.Key, error) {
	c, s, ok := strings.Cut(id, ":")
	if !ok {
		return search.Key{}, fmt.Errorf("bleve: document id %q", id)
	}
	conv, err1 := strconv.ParseUint(c, 16, 64)
	seq, err2 := strconv.ParseUint(s, 16, 64)
	if err1 != nil || err2 != nil {
		return search.Key{}, fmt.Errorf("bleve: document id %q", id)
	}
	return search.Key{ConvID: conv, Seq: seq}, nil
}

// timeValue is the time doc value: 16 hex digits, so strings sort as times.
func timeValue(t int64) string { return fmt.Sprintf("%016x", uint64(max(t, 0))) }

// bucketShifts are the sizes of the time buckets a document is in, from
// 2^12 ms (about 4 s) to 2^44 ms (the largest holds every time from 1970
// to the year 2527): a newest-first query reads buckets from its upper
// bound down (newestFirst).
var bucketShifts = []uint{12, 16, 20, 24, 28, 32, 36, 40, 44}

// stepDocs is the fewest documents a newest-first step may read (a
// variable for the tests).
var stepDocs uint64 = 4096

func bucketTerm(shift uint, t int64) string {
	return fmt.Sprintf("%02d%x", shift, uint64(max(t, 0))>>shift)
}

func timeBuckets(t int64) []string {
	out := make([]string, len(bucketShifts))
	for i, sh := range bucketShifts {
		out[i] = bucketTerm(sh, t)
	}
	return out
}

func markKey(conv uint64) []byte { return binary.BigEndian.AppendUint64([]byte{'w'}, conv) }

func convTerm(conv uint64) string { return strconv.FormatUint(conv, 10) }

func (x *Index) Apply(ctx context.Context, b search.Batch) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return search.ErrClosed
	}
	bb := x.idx.NewBatch()
	for _, k := range b.Delete {
		bb.Delete(docID(k))
	}
	newest := x.newest.Load()
	for _, d := range b.Put {
		newest = max(newest, d.Time)
		if err := bb.Index(docID(search.Key{ConvID: d.ConvID, Seq: d.Seq}), map[string]any{
			"text":   d.Text,
			"conv":   convTerm(d.ConvID),
			"sender": d.Sender,
			"kind":   d.Kind,
			"time":   timeValue(d.Time),
			"tb":     timeBuckets(d.Time),
		}); err != nil {
			return fmt.Errorf("bleve: index %d:%d: %w", d.ConvID, d.Seq, err)
		}
	}
	for conv, seq := range b.Marks {
		cur, err := x.watermark(conv)
		if err != nil {
			return err
		}
		if seq > cur {
			bb.SetInternal(markKey(conv), binary.BigEndian.AppendUint64(nil, seq))
		}
	}
	x.unpersisted.Add(1)
	done := sync.OnceFunc(func() {
		x.unpersisted.Add(-1)
		select {
		case x.persisted <- struct{}{}:
		default:
		}
	})
	bb.SetPersistedCallback(func(error) { done() })
	if err := x.idx.Batch(bb); err != nil {
		done()
		return fmt.Errorf("bleve: batch: %w", err)
	}
	x.newest.Store(newest)
	return nil
}

func (x *Index) watermark(conv uint64) (uint64, error) {
	v, err := x.idx.GetInternal(markKey(conv))
	if err != nil {
		return 0, fmt.Errorf("bleve: watermark %d: %w", conv, err)
	}
	if len(v) != 8 {
		return 0, nil
	}
	return binary.BigEndian.Uint64(v), nil
}

func (x *Index) Watermark(ctx context.Context, conv uint64) (uint64, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.closed {
		return 0, search.ErrClosed
	}
	return x.watermark(conv)
}

func term(field, v string) query.Query {
	q := blevesearch.NewTermQuery(v)
	q.SetField(field)
	return q
}

// filter keeps the matches of q whose key (read from the document id,
// which scorch keeps uncompressed, and left on the match for the sort)
// and time accept takes.
type filter struct {
	q      query.Query
	accept func(k search.Key, t int64) bool
}

func (f *filter) Searcher(ctx context.Context, r index.IndexReader, m mapping.IndexMapping, o bsearch.SearcherOptions) (bsearch.Searcher, error) {
	s, err := f.q.Searcher(ctx, r, m, o)
	if err != nil {
		return nil, err
	}
	dvr, err := r.DocValueReader([]string{"time"})
	if err != nil {
		s.Close()
		return nil, err
	}
	var t int64
	visit := func(_ string, v []byte) {
		if u, err := strconv.ParseUint(string(v), 16, 63); err == nil {
			t = int64(u)
		}
	}
	return searcher.NewFilteringSearcher(ctx, s, func(_ *bsearch.SearchContext, d *bsearch.DocumentMatch) bool {
		id, err := r.ExternalID(d.IndexInternalID)
		if err != nil {
			return false
		}
		k, err := parseID(id)
		if err != nil {
			return false
		}
		t = -1
		if dvr.VisitDocValues(d.IndexInternalID, visit) != nil || !f.accept(k, t) {
			return false
		}
		d.ID = id
		return true
	}), nil
}

// windowSet answers whether (conv, seq) lies in one of the windows.
type windowSet map[uint64][]search.Window

func newWindowSet(ws []search.Window) windowSet {
	s := make(windowSet, len(ws))
	for _, w := range ws {
		s[w.ConvID] = append(s[w.ConvID], w)
	}
	return s
}

func (s windowSet) has(conv, seq uint64) bool {
	for _, w := range s[conv] {
		if seq >= w.From && (w.To == 0 || seq <= w.To) {
			return true
		}
	}
	return false
}

func (x *Index) Search(ctx context.Context, q search.Query) (search.Result, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.closed {
		return search.Result{}, search.ErrClosed
	}
	if len(q.Windows) == 0 {
		return search.Result{}, nil
	}
	var after []string
	if q.Cursor != "" {
		c, err := search.DecodeCursor(q.Cursor, q.Order)
		if err != nil {
			return search.Result{}, err
		}
		after = c.After
		if want := 2 + int(q.Order); len(after) != want {
			return search.Result{}, fmt.Errorf("%w: malformed", search.ErrBadCursor)
		}
	}
	ph := blevesearch.NewMatchPhraseQuery(q.Text)
	ph.SetField("text")
	ph.Analyzer = textAnalyzer
	must := []query.Query{ph}
	ws := newWindowSet(q.Windows)
	if len(ws) <= fewWindows {
		var cs []query.Query
		for c := range ws {
			cs = append(cs, term("conv", convTerm(c)))
		}
		must = append(must, blevesearch.NewDisjunctionQuery(cs...))
	}
	if q.Sender != "" {
		must = append(must, term("sender", q.Sender))
	}
	if q.Kind != "" {
		must = append(must, term("kind", q.Kind))
	}
	lo, hi := q.FromTime, q.ToTime
	if hi == 0 {
		hi = math.MaxInt64
	}
	var hits []*bsearch.DocumentMatch
	if q.Order == search.Relevance {
		res, err := x.search(ctx, must, ws, lo, hi, q.Limit+1, after, true)
		if err != nil {
			return search.Result{}, err
		}
		hits = res
	} else {
		if after != nil {
			// The cursor's time bounds the steps; search-after orders
			// the messages of that very millisecond.
			u, err := strconv.ParseUint(after[0], 16, 63)
			if err != nil {
				return search.Result{}, fmt.Errorf("%w: malformed", search.ErrBadCursor)
			}
			hi = min(hi, int64(u))
		}
		var err error
		if hits, err = x.newestFirst(ctx, must, ws, lo, min(hi, x.newest.Load()), q.Limit+1, after); err != nil {
			return search.Result{}, err
		}
	}
	var out search.Result
	for i, h := range hits {
		if i == q.Limit {
			out.Next = search.EncodeCursor(search.Cursor{Order: q.Order, After: afterOf(hits[i-1])})
			break
		}
		k, err := parseID(h.ID)
		if err != nil {
			return search.Result{}, err
		}
		out.Hits = append(out.Hits, search.Hit{ConvID: k.ConvID, Seq: k.Seq, Score: h.Score})
	}
	return out, nil
}

// newestFirst reads the time buckets around the upper bound hi, newest
// first, until size hits are found or lo is passed: each step takes the
// largest bucket below what was read that holds at most four times the
// documents read so far (at least stepDocs; the smallest bucket when even
// that holds more), so a phrase that matches often is evaluated on the
// newest messages only and one that matches rarely on at most a few times
// the index.
func (x *Index) newestFirst(ctx context.Context, must []query.Query, ws windowSet, lo, hi int64, size int, after []string) ([]*bsearch.DocumentMatch, error) {
	ii, err := x.idx.Advanced()
	if err != nil {
		return nil, fmt.Errorf("bleve: search: %w", err)
	}
	r, err := ii.Reader()
	if err != nil {
		return nil, fmt.Errorf("bleve: search: %w", err)
	}
	defer r.Close()
	count := func(term string) (uint64, error) {
		tfr, err := r.TermFieldReader(ctx, []byte(term), "tb", false, false, false)
		if err != nil {
			return 0, fmt.Errorf("bleve: search: %w", err)
		}
		defer tfr.Close()
		return tfr.Count(), nil
	}
	var hits []*bsearch.DocumentMatch
	read := uint64(0)
	for top := hi; top >= lo && len(hits) < size; {
		budget := max(4*read, stepDocs)
		level, n := 0, uint64(0)
		for i, sh := range bucketShifts {
			c, err := count(bucketTerm(sh, top))
			if err != nil {
				return nil, err
			}
			if i > 0 && c > budget {
				break
			}
			level, n = i, c
		}
		sh := bucketShifts[level]
		stepLo := max(lo, int64(uint64(top)>>sh<<sh))
		m := append(slices.Clip(must), term("tb", bucketTerm(sh, top)))
		res, err := x.search(ctx, m, ws, stepLo, top, size-len(hits), after, false)
		if err != nil {
			return nil, err
		}
		hits = append(hits, res...)
		read += n
		top = stepLo - 1
	}
	return hits, nil
}

// search runs one request: the conjunction must, filtered by the windows
// and lo ≤ time ≤ hi, the first size hits after the cursor's, by time (and
// first by score when byScore).
func (x *Index) search(ctx context.Context, must []query.Query, ws windowSet, lo, hi int64, size int, after []string, byScore bool) ([]*bsearch.DocumentMatch, error) {
	f := &filter{q: blevesearch.NewConjunctionQuery(must...), accept: func(k search.Key, t int64) bool {
		return t >= lo && t <= hi && ws.has(k.ConvID, k.Seq)
	}}
	req := blevesearch.NewSearchRequestOptions(f, size, 0, false)
	order := bsearch.SortOrder{
		&bsearch.SortField{Field: "time", Type: bsearch.SortFieldAsString, Desc: true},
		&bsearch.SortDocID{Desc: true},
	}
	if byScore {
		order = append(bsearch.SortOrder{&bsearch.SortScore{Desc: true}}, order...)
	}
	req.SortByCustom(order)
	if after != nil {
		req.SetSearchAfter(after)
	}
	res, err := x.idx.SearchInContext(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("bleve: search: %w", err)
	}
	return res.Hits, nil
}

// afterOf is the search-after value of a hit: its decoded sort values,
// the score written out where the sort names it.
func afterOf(h *bsearch.DocumentMatch) []string {
	after := slices.Clone(h.DecodedSort)
	for i, v := range after {
		if v == "_score" {
			after[i] = strconv.FormatFloat(h.Score, 'g', -1, 64)
		}
	}
	return after
}

func (x *Index) Count(ctx context.Context, conv uint64) (uint64, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.closed {
		return 0, search.ErrClosed
	}
	req := blevesearch.NewSearchRequestOptions(term("conv", convTerm(conv)), 0, 0, false)
	res, err := x.idx.SearchInContext(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("bleve: count: %w", err)
	}
	return res.Total, nil
}

// DocCount is the number of documents in the index.
func (x *Index) DocCount() (uint64, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if x.closed {
		return 0, search.ErrClosed
	}
	return x.idx.DocCount()
}

func (x *Index) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	deadline := time.NewTimer(closeWait)
	defer deadline.Stop()
	for x.unpersisted.Load() > 0 {
		select {
		case <-x.persisted:
		case <-deadline.C:
			return x.idx.Close()
		}
	}
	return x.idx.Close()
}
