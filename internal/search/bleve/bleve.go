// Package bleve is the embedded search engine: a Bleve v2 (scorch) index
// in a directory of its own (data_dir/search on a node).
//
// A message is a document with id "<conv>:<seq>" (16 hex digits each, so
// ids sort as keys do) and these fields: text twice, `text` with Bleve's
// standard analyzer (Unicode word segmentation: every CJK character is a
// word of its own, lower-cased, English stop words dropped) and
// `text_cjk` with its cjk analyzer (bigrams of adjacent CJK characters,
// width-folded, lower-cased); conv, sender and kind as keywords; seq and
// time as numbers. Neither text is stored: a hit names a message, whose
// body the caller reads from the store. A query is the phrase on either
// text field, AND the filters, AND a disjunction of one clause per window
// (conv = c, or conv = c AND from ≤ seq ≤ to), so the engine itself never
// returns what the windows exclude.
//
// Watermarks are Bleve internal values ("w" + conv) set in the same batch
// as the documents; a batch returns once scorch has persisted it.
package bleve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	blevesearch "github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/analysis/analyzer/keyword"
	"github.com/blevesearch/bleve/v2/analysis/analyzer/standard"
	"github.com/blevesearch/bleve/v2/analysis/lang/cjk"
	"github.com/blevesearch/bleve/v2/mapping"
	bsearch "github.com/blevesearch/bleve/v2/search"
	"github.com/blevesearch/bleve/v2/search/query"

	"github.com/parley-im/parley/internal/search"
)

// Index is the Bleve engine.
type Index struct {
	idx blevesearch.Index
	// mu orders Apply (watermarks are read, raised and written) and
	// Close.
	mu     sync.RWMutex
	closed bool
}

var _ search.Index = (*Index)(nil)

func indexMapping() mapping.IndexMapping {
	im := blevesearch.NewIndexMapping()
	im.DefaultAnalyzer = keyword.Name
	im.StoreDynamic = false
	im.IndexDynamic = false
	im.DocValuesDynamic = false
	dm := blevesearch.NewDocumentStaticMapping()
	text := func(analyzer string) *mapping.FieldMapping {
		f := blevesearch.NewTextFieldMapping()
		f.Analyzer = analyzer
		f.Store = false
		f.IncludeInAll = false
		f.IncludeTermVectors = true // positions: phrases
		f.DocValues = false
		return f
	}
	kw := func() *mapping.FieldMapping {
		f := blevesearch.NewKeywordFieldMapping()
		f.Store = false
		f.IncludeInAll = false
		f.IncludeTermVectors = false
		f.DocValues = false
		return f
	}
	num := func(docValues bool) *mapping.FieldMapping {
		f := blevesearch.NewNumericFieldMapping()
		f.Store = false
		f.IncludeInAll = false
		f.DocValues = docValues
		return f
	}
	dm.AddFieldMappingsAt("text", text(standard.Name))
	dm.AddFieldMappingsAt("text_cjk", text(cjk.AnalyzerName))
	dm.AddFieldMappingsAt("conv", kw())
	dm.AddFieldMappingsAt("sender", kw())
	dm.AddFieldMappingsAt("kind", kw())
	dm.AddFieldMappingsAt("seq", num(false))
	dm.AddFieldMappingsAt("time", num(true)) // sorted on
	im.DefaultMapping = dm
	return im
}

// Open opens the index in dir, creating it when there is none.
func Open(dir string) (*Index, error) {
	idx, err := blevesearch.Open(dir)
	if errors.Is(err, blevesearch.ErrorIndexPathDoesNotExist) {
		idx, err = blevesearch.New(dir, indexMapping())
	}
	if err != nil {
		return nil, fmt.Errorf("bleve: open %s: %w", dir, err)
	}
	return &Index{idx: idx}, nil
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
	for _, d := range b.Put {
		if err := bb.Index(docID(search.Key{ConvID: d.ConvID, Seq: d.Seq}), map[string]any{
			"text":     d.Text,
			"text_cjk": d.Text,
			"conv":     convTerm(d.ConvID),
			"sender":   d.Sender,
			"kind":     d.Kind,
			"seq":      float64(d.Seq),
			"time":     float64(d.Time),
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
	if err := x.idx.Batch(bb); err != nil {
		return fmt.Errorf("bleve: batch: %w", err)
	}
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

func numRange(field string, lo, hi float64) query.Query {
	t := true
	var min, max *float64
	if lo > math.Inf(-1) {
		min = &lo
	}
	if hi < math.Inf(1) {
		max = &hi
	}
	q := blevesearch.NewNumericRangeInclusiveQuery(min, max, &t, &t)
	q.SetField(field)
	return q
}

func phrase(field, analyzer, text string) query.Query {
	q := blevesearch.NewMatchPhraseQuery(text)
	q.SetField(field)
	q.Analyzer = analyzer
	return q
}

// windows is the disjunction of the query's windows.
func windows(ws []search.Window) query.Query {
	var cs []query.Query
	for _, w := range ws {
		c := term("conv", convTerm(w.ConvID))
		if w.From <= 1 && w.To == 0 {
			cs = append(cs, c)
			continue
		}
		hi := math.Inf(1)
		if w.To != 0 {
			hi = float64(w.To)
		}
		cs = append(cs, blevesearch.NewConjunctionQuery(c, numRange("seq", float64(w.From), hi)))
	}
	return blevesearch.NewDisjunctionQuery(cs...)
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
	}
	must := []query.Query{
		blevesearch.NewDisjunctionQuery(
			phrase("text", standard.Name, q.Text),
			phrase("text_cjk", cjk.AnalyzerName, q.Text)),
		windows(q.Windows),
	}
	if q.Sender != "" {
		must = append(must, term("sender", q.Sender))
	}
	if q.Kind != "" {
		must = append(must, term("kind", q.Kind))
	}
	if q.FromTime != 0 || q.ToTime != 0 {
		lo, hi := math.Inf(-1), math.Inf(1)
		if q.FromTime != 0 {
			lo = float64(q.FromTime)
		}
		if q.ToTime != 0 {
			hi = float64(q.ToTime)
		}
		must = append(must, numRange("time", lo, hi))
	}
	req := blevesearch.NewSearchRequestOptions(blevesearch.NewConjunctionQuery(must...), q.Limit+1, 0, false)
	if q.Order == search.Relevance {
		req.SortBy([]string{"-_score", "-time", "-_id"})
	} else {
		req.SortBy([]string{"-time", "-_id"})
	}
	if after != nil {
		if len(after) != len(req.Sort) {
			return search.Result{}, fmt.Errorf("%w: malformed", search.ErrBadCursor)
		}
		req.SetSearchAfter(after)
	}
	res, err := x.idx.SearchInContext(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return search.Result{}, ctx.Err()
		}
		return search.Result{}, fmt.Errorf("bleve: search: %w", err)
	}
	var out search.Result
	for i, h := range res.Hits {
		if i == q.Limit {
			out.Next = search.EncodeCursor(search.Cursor{Order: q.Order, After: afterOf(res.Hits[i-1])})
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
	return x.idx.Close()
}
