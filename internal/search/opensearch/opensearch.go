// Package opensearch is the search engine of cluster mode: search.Index on
// an OpenSearch 2 cluster, through opensearch-go v4, shared by every chat
// process of a deployment.
//
// Two indexes per deployment, named after a prefix: <prefix>-messages
// holds one document per message, id "<conv>:<seq>" (16 hex digits each,
// so ids sort as keys do), and <prefix>-marks one empty document per
// conversation whose version is the conversation's watermark.
//
// A message's text is indexed twice, neither copy stored: `text` with the
// standard tokenizer (Unicode word segmentation: each CJK character a
// token), cjk_width (full-width Latin and half-width kana folded) and
// lowercase; `text.cjk` adds cjk_bigram (adjacent CJK characters as
// bigrams). A query is the phrase on either field, so every exact Chinese
// phrase is found through `text` while bigrams weigh CJK words in
// relevance. The filters and the caller's membership windows are a bool
// filter of the same query (one terms clause for whole conversations, a
// conv AND seq-range clause per partial window), so the engine never
// returns what the windows exclude and every page is full when enough
// hits exist. Hits sort by time then id (newest) or score, time, id
// (relevance); the cursor is the last hit's sort values (search_after).
//
// Apply writes the documents with one bulk request (or several, each at
// most maxBulkBytes) with refresh=true, so a search after Apply sees
// them, and only after every item succeeded the watermarks, as external
// versions (version_type=external_gte): a watermark never goes down, even
// between chat processes indexing the same conversation, and never runs
// ahead of the documents it covers. An Apply cut short leaves documents
// without their watermark, which the indexer writes again: puts and
// deletes by key are idempotent. OpenSearch acknowledges a write once its
// translog is fsynced (index.translog.durability: request, the default).
//
// Methods are safe for concurrent use; the client is safe too and holds
// no state of ours but the closed flag.
package opensearch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/opensearch-project/opensearch-go/v4"

	"github.com/parley-im/parley/internal/search"
)

// Config of an index.
type Config struct {
	// URLs of the cluster's nodes (or of a balancer in front), each
	// http(s)://[user:password@]host:port.
	URLs []string
	// Prefix names the deployment's two indexes (default "parley").
	Prefix string
	// Shards and Replicas of the messages index when Open creates it
	// (defaults 1 and 0); the marks index has one shard.
	Shards, Replicas int
	// Timeout bounds each HTTP attempt (default 30s).
	Timeout time.Duration
}

// Index is the OpenSearch engine.
type Index struct {
	c      *opensearch.Client
	docs   string
	marks  string
	closed atomic.Bool
}

var _ search.Index = (*Index)(nil)

// maxBulkBytes bounds one bulk request's body, well under OpenSearch's
// http.max_content_length (100 MB).
const maxBulkBytes = 8 << 20

// Open connects to the cluster and creates the two indexes when they do
// not exist (several processes may race to: the loser finds them made).
func Open(ctx context.Context, cfg Config) (*Index, error) {
	x, err := connect(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 1
	}
	if err := x.create(ctx, x.docs, messagesIndex(cfg.Shards, cfg.Replicas)); err != nil {
		x.Close()
		return nil, err
	}
	if err := x.create(ctx, x.marks, marksIndex(cfg.Replicas)); err != nil {
		x.Close()
		return nil, err
	}
	return x, nil
}

// Drop deletes the two indexes of cfg: everything indexed and every
// watermark (an indexer then indexes everything again).
func Drop(ctx context.Context, cfg Config) error {
	x, err := connect(cfg)
	if err != nil {
		return err
	}
	defer x.Close()
	err = do[struct{}](ctx, x, http.MethodDelete, request{path: "/" + x.docs + "," + x.marks, params: url.Values{"ignore_unavailable": {"true"}}}, nil)
	if err != nil {
		return fmt.Errorf("opensearch: drop: %w", err)
	}
	return nil
}

// connect makes the client; credentials in a URL are its basic auth.
func connect(cfg Config) (*Index, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "parley"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if len(cfg.URLs) == 0 {
		return nil, errors.New("opensearch: no URL")
	}
	oc := opensearch.Config{RequestTimeout: cfg.Timeout}
	for _, s := range cfg.URLs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("opensearch: URL %q: %w", s, err)
		}
		if u.User != nil {
			oc.Username = u.User.Username()
			oc.Password, _ = u.User.Password()
			u.User = nil
		}
		oc.Addresses = append(oc.Addresses, u.String())
	}
	c, err := opensearch.NewClient(oc)
	if err != nil {
		return nil, fmt.Errorf("opensearch: client: %w", err)
	}
	return &Index{c: c, docs: cfg.Prefix + "-messages", marks: cfg.Prefix + "-marks"}, nil
}

func messagesIndex(shards, replicas int) map[string]any {
	return map[string]any{
		"settings": map[string]any{
			"number_of_shards":   shards,
			"number_of_replicas": replicas,
			"analysis": map[string]any{"analyzer": map[string]any{
				"parley_text": map[string]any{"type": "custom", "tokenizer": "standard", "filter": []string{"cjk_width", "lowercase"}},
				"parley_cjk":  map[string]any{"type": "custom", "tokenizer": "standard", "filter": []string{"cjk_width", "lowercase", "cjk_bigram"}},
			}},
		},
		"mappings": map[string]any{
			"dynamic": "strict",
			"_source": map[string]any{"excludes": []string{"text"}},
			"properties": map[string]any{
				"text": map[string]any{"type": "text", "analyzer": "parley_text",
					"fields": map[string]any{"cjk": map[string]any{"type": "text", "analyzer": "parley_cjk"}}},
				"conv":   map[string]any{"type": "keyword"},
				"seq":    map[string]any{"type": "long"},
				"time":   map[string]any{"type": "long"},
				"id":     map[string]any{"type": "keyword"}, // the sort's last key
				"sender": map[string]any{"type": "keyword"},
				"kind":   map[string]any{"type": "keyword"},
				"msg":    map[string]any{"type": "keyword", "index": false, "doc_values": false},
			},
		},
	}
}

func marksIndex(replicas int) map[string]any {
	return map[string]any{
		"settings": map[string]any{"number_of_shards": 1, "number_of_replicas": replicas},
		"mappings": map[string]any{"dynamic": "strict", "_source": map[string]any{"enabled": false}, "properties": map[string]any{}},
	}
}

// request is one HTTP request of ours through the client's transport
// (retries, node selection, auth).
type request struct {
	path   string
	params url.Values
	body   []byte
	ndjson bool
}

func (r request) GetRequest(method string) (*http.Request, error) {
	u := r.path
	if len(r.params) > 0 {
		u += "?" + r.params.Encode()
	}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return nil, err
	}
	if r.body != nil {
		if r.ndjson {
			req.Header.Set("Content-Type", "application/x-ndjson")
		} else {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	return req, nil
}

// apiError is an error response.
type apiError struct {
	Status int
	Type   string
	Reason string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("status %d: %s: %s", e.Status, e.Type, e.Reason)
}

// do sends r and decodes a 2xx answer into out (nil: none); another
// status is an *apiError.
func do[T any](ctx context.Context, x *Index, method string, r request, out *T) error {
	if x.closed.Load() {
		return search.ErrClosed
	}
	resp, err := opensearch.Do(ctx, x.c, method, r, out)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	if !resp.IsError() {
		if out == nil && resp.Body != nil {
			io.Copy(io.Discard, resp.Body)
		}
		return nil
	}
	e := &apiError{Status: resp.StatusCode}
	if resp.Body != nil {
		var body struct {
			Error struct {
				Type   string `json:"type"`
				Reason string `json:"reason"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &body) == nil {
			e.Type, e.Reason = body.Error.Type, body.Error.Reason
		} else {
			e.Reason = string(b)
		}
	}
	return e
}

func statusOf(err error) int {
	var e *apiError
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func (x *Index) create(ctx context.Context, name string, def map[string]any) error {
	err := do[struct{}](ctx, x, http.MethodHead, request{path: "/" + name}, nil)
	if err == nil {
		return nil
	}
	if statusOf(err) != http.StatusNotFound {
		return fmt.Errorf("opensearch: index %s: %w", name, err)
	}
	b, _ := json.Marshal(def)
	err = do[struct{}](ctx, x, http.MethodPut, request{path: "/" + name, params: url.Values{"wait_for_active_shards": {"1"}}, body: b}, nil)
	var e *apiError
	if errors.As(err, &e) && e.Type == "resource_already_exists_exception" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opensearch: create index %s: %w", name, err)
	}
	return nil
}

func docID(k search.Key) string { return fmt.Sprintf("%016x:%016x", k.ConvID, k.Seq) }

func parseID(id string) (search.Key, error) {
	c, s, ok := strings.Cut(id, ":")
	if !ok || len(c) != 16 || len(s) != 16 {
		return search.Key{}, fmt.Errorf("opensearch: document id %q", id)
	}
	conv, err1 := strconv.ParseUint(c, 16, 64)
	seq, err2 := strconv.ParseUint(s, 16, 64)
	if err1 != nil || err2 != nil {
		return search.Key{}, fmt.Errorf("opensearch: document id %q", id)
	}
	return search.Key{ConvID: conv, Seq: seq}, nil
}

func convTerm(conv uint64) string { return strconv.FormatUint(conv, 10) }

type bulkResponse struct {
	Errors bool `json:"errors"`
	Items  []map[string]struct {
		ID     string `json:"_id"`
		Status int    `json:"status"`
		Error  *struct {
			Type   string `json:"type"`
			Reason string `json:"reason"`
		} `json:"error"`
	} `json:"items"`
}

// bulk sends the NDJSON lines of body; ok says which failed item is no
// failure (a delete of a missing key, a watermark already as high).
func (x *Index) bulk(ctx context.Context, body []byte, refresh bool, ok func(op string, status int) bool) error {
	p := url.Values{}
	if refresh {
		p.Set("refresh", "true")
	}
	var r bulkResponse
	if err := do(ctx, x, http.MethodPost, request{path: "/_bulk", params: p, body: body, ndjson: true}, &r); err != nil {
		return fmt.Errorf("opensearch: bulk: %w", err)
	}
	if !r.Errors {
		return nil
	}
	for _, it := range r.Items {
		for op, v := range it {
			if v.Status < 300 || ok(op, v.Status) {
				continue
			}
			if v.Error != nil {
				return fmt.Errorf("opensearch: bulk %s %s: status %d: %s: %s", op, v.ID, v.Status, v.Error.Type, v.Error.Reason)
			}
			return fmt.Errorf("opensearch: bulk %s %s: status %d", op, v.ID, v.Status)
		}
	}
	return nil
}

type docSource struct {
	Text   string `json:"text"`
	Conv   string `json:"conv"`
	Seq    uint64 `json:"seq"`
	Time   int64  `json:"time"`
	ID     string `json:"id"`
	Sender string `json:"sender"`
	Kind   string `json:"kind"`
	Msg    string `json:"msg"`
}

func line(buf *bytes.Buffer, v any) {
	b, _ := json.Marshal(v)
	buf.Write(b)
	buf.WriteByte('\n')
}

func (x *Index) Apply(ctx context.Context, b search.Batch) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if x.closed.Load() {
		return search.ErrClosed
	}
	var buf bytes.Buffer
	flush := func() error {
		if buf.Len() == 0 {
			return nil
		}
		err := x.bulk(ctx, buf.Bytes(), true, func(op string, status int) bool {
			return op == "delete" && status == http.StatusNotFound
		})
		buf.Reset()
		return err
	}
	type meta struct {
		Index string `json:"_index"`
		ID    string `json:"_id"`
	}
	// Deletes before puts, as a batch never names one key in both.
	for _, k := range b.Delete {
		line(&buf, map[string]meta{"delete": {x.docs, docID(k)}})
		if buf.Len() >= maxBulkBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	for _, d := range b.Put {
		if d.Seq > math.MaxInt64 {
			return fmt.Errorf("opensearch: seq %d of conversation %d out of range", d.Seq, d.ConvID)
		}
		id := docID(search.Key{ConvID: d.ConvID, Seq: d.Seq})
		line(&buf, map[string]meta{"index": {x.docs, id}})
		line(&buf, docSource{Text: d.Text, Conv: convTerm(d.ConvID), Seq: d.Seq, Time: d.Time, ID: id,
			Sender: d.Sender, Kind: d.Kind, Msg: strconv.FormatUint(d.MsgID, 10)})
		if buf.Len() >= maxBulkBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if len(b.Marks) == 0 {
		return nil
	}
	type markMeta struct {
		Index       string `json:"_index"`
		ID          string `json:"_id"`
		Version     uint64 `json:"version"`
		VersionType string `json:"version_type"`
	}
	for conv, seq := range b.Marks {
		if seq > math.MaxInt64 {
			return fmt.Errorf("opensearch: watermark %d of conversation %d out of range", seq, conv)
		}
		line(&buf, map[string]markMeta{"index": {x.marks, convTerm(conv), seq, "external_gte"}})
		buf.WriteString("{}\n")
	}
	// A lower watermark than the stored one is a version conflict: the
	// stored one stays, as the seam wants.
	return x.bulk(ctx, buf.Bytes(), false, func(op string, status int) bool { return status == http.StatusConflict })
}

func (x *Index) Watermark(ctx context.Context, conv uint64) (uint64, error) {
	var r struct {
		Found   bool   `json:"found"`
		Version uint64 `json:"_version"`
	}
	err := do(ctx, x, http.MethodGet, request{path: "/" + x.marks + "/_doc/" + convTerm(conv)}, &r)
	if statusOf(err) == http.StatusNotFound {
		return 0, nil
	}
	if err != nil {
		if errors.Is(err, search.ErrClosed) || ctx.Err() != nil {
			return 0, err
		}
		return 0, fmt.Errorf("opensearch: watermark %d: %w", conv, err)
	}
	if !r.Found {
		return 0, nil
	}
	return r.Version, nil
}

func term(field string, v any) map[string]any {
	return map[string]any{"term": map[string]any{field: v}}
}

// windows is the filter of the query's windows: whole conversations in
// one terms clause, each partial window a clause of its own.
func windows(ws []search.Window) map[string]any {
	var whole []string
	var should []any
	for _, w := range ws {
		if w.From <= 1 && w.To == 0 {
			whole = append(whole, convTerm(w.ConvID))
			continue
		}
		r := map[string]any{"gte": w.From}
		if w.To != 0 {
			r["lte"] = w.To
		}
		should = append(should, map[string]any{"bool": map[string]any{"filter": []any{
			term("conv", convTerm(w.ConvID)),
			map[string]any{"range": map[string]any{"seq": r}},
		}}})
	}
	if len(whole) > 0 {
		should = append(should, map[string]any{"terms": map[string]any{"conv": whole}})
	}
	return map[string]any{"bool": map[string]any{"should": should, "minimum_should_match": 1}}
}

// after turns a cursor's values back into the sort's: the score a float,
// the time an integer, the id a document id.
func after(c search.Cursor, o search.Order) ([]any, error) {
	bad := fmt.Errorf("%w: malformed", search.ErrBadCursor)
	vs := c.After
	var out []any
	if o == search.Relevance {
		if len(vs) != 3 {
			return nil, bad
		}
		s, err := strconv.ParseFloat(vs[0], 64)
		if err != nil || math.IsNaN(s) || math.IsInf(s, 0) {
			return nil, bad
		}
		out = append(out, s)
		vs = vs[1:]
	}
	if len(vs) != 2 {
		return nil, bad
	}
	t, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil {
		return nil, bad
	}
	if _, err := parseID(vs[1]); err != nil {
		return nil, bad
	}
	return append(out, t, vs[1]), nil
}

type searchResponse struct {
	Hits struct {
		Hits []struct {
			ID     string            `json:"_id"`
			Score  *float64          `json:"_score"`
			Sort   []json.RawMessage `json:"sort"`
			Source struct {
				Time   int64  `json:"time"`
				Sender string `json:"sender"`
				Msg    string `json:"msg"`
			} `json:"_source"`
		} `json:"hits"`
	} `json:"hits"`
}

// sortString is a sort value as a cursor keeps it: a number as written
// (so a cursor hands OpenSearch back exactly the score it sent), a string
// bare.
func sortString(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	return string(v)
}

func (x *Index) Search(ctx context.Context, q search.Query) (search.Result, error) {
	if x.closed.Load() {
		return search.Result{}, search.ErrClosed
	}
	if len(q.Windows) == 0 {
		return search.Result{}, nil
	}
	var searchAfter []any
	if q.Cursor != "" {
		c, err := search.DecodeCursor(q.Cursor, q.Order)
		if err != nil {
			return search.Result{}, err
		}
		if searchAfter, err = after(c, q.Order); err != nil {
			return search.Result{}, err
		}
	}
	filter := []any{windows(q.Windows)}
	if q.Sender != "" {
		filter = append(filter, term("sender", q.Sender))
	}
	if q.Kind != "" {
		filter = append(filter, term("kind", q.Kind))
	}
	if q.FromTime != 0 || q.ToTime != 0 {
		r := map[string]any{}
		if q.FromTime != 0 {
			r["gte"] = q.FromTime
		}
		if q.ToTime != 0 {
			r["lte"] = q.ToTime
		}
		filter = append(filter, map[string]any{"range": map[string]any{"time": r}})
	}
	phrase := func(field string) any {
		return map[string]any{"match_phrase": map[string]any{field: map[string]any{"query": q.Text}}}
	}
	sort := []any{map[string]any{"time": "desc"}, map[string]any{"id": "desc"}}
	if q.Order == search.Relevance {
		sort = append([]any{map[string]any{"_score": "desc"}}, sort...)
	}
	body := map[string]any{
		"size":             q.Limit + 1,
		"track_total_hits": false,
		"track_scores":     q.Order == search.Relevance,
		"_source":          []string{"time", "sender", "msg"},
		"sort":             sort,
		"query": map[string]any{"bool": map[string]any{
			"must": []any{map[string]any{"bool": map[string]any{
				"should": []any{phrase("text"), phrase("text.cjk")}, "minimum_should_match": 1,
			}}},
			"filter": filter,
		}},
	}
	if searchAfter != nil {
		body["search_after"] = searchAfter
	}
	b, _ := json.Marshal(body)
	var r searchResponse
	if err := do(ctx, x, http.MethodPost, request{path: "/" + x.docs + "/_search", body: b}, &r); err != nil {
		if errors.Is(err, search.ErrClosed) || ctx.Err() != nil {
			return search.Result{}, err
		}
		return search.Result{}, fmt.Errorf("opensearch: search: %w", err)
	}
	var out search.Result
	for i, h := range r.Hits.Hits {
		if i == q.Limit {
			prev := r.Hits.Hits[i-1].Sort
			vals := make([]string, len(prev))
			for j, v := range prev {
				vals[j] = sortString(v)
			}
			out.Next = search.EncodeCursor(search.Cursor{Order: q.Order, After: vals})
			break
		}
		k, err := parseID(h.ID)
		if err != nil {
			return search.Result{}, err
		}
		hit := search.Hit{ConvID: k.ConvID, Seq: k.Seq, Sender: h.Source.Sender, Time: h.Source.Time}
		hit.MsgID, _ = strconv.ParseUint(h.Source.Msg, 10, 64)
		if h.Score != nil {
			hit.Score = *h.Score
		}
		out.Hits = append(out.Hits, hit)
	}
	return out, nil
}

func (x *Index) Count(ctx context.Context, conv uint64) (uint64, error) {
	b, _ := json.Marshal(map[string]any{"query": term("conv", convTerm(conv))})
	var r struct {
		Count uint64 `json:"count"`
	}
	if err := do(ctx, x, http.MethodPost, request{path: "/" + x.docs + "/_count", body: b}, &r); err != nil {
		if errors.Is(err, search.ErrClosed) || ctx.Err() != nil {
			return 0, err
		}
		return 0, fmt.Errorf("opensearch: count: %w", err)
	}
	return r.Count, nil
}

// Close stops using the cluster: later calls fail with search.ErrClosed.
// It is safe to call twice.
func (x *Index) Close() error {
	if x.closed.Swap(true) {
		return nil
	}
	return x.c.Close()
}
