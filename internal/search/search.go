// Package search is full-text search of plain conversations: the seam
// Index, declared here and implemented by one package per engine
// (internal/search/bleve, an index in data_dir/search on an embedded
// node), with the conformance suite internal/search/searchtest that every
// engine passes unchanged.
//
// A document is one message, keyed by (conversation, seq): putting the
// same key again replaces it (an edit), deleting it removes it (a recall,
// an operator's delete). Each conversation has a watermark, the highest
// seq the index has taken into account, written in the same atomic batch
// as the documents, so an indexer that crashes resumes from it and loses
// nothing (indexer.go). End-to-end encrypted conversations are never
// indexed: the server holds only their ciphertext.
//
// A query is a phrase: the words of its text in order (CJK text matches
// as a phrase of characters, so every exact Chinese phrase is found),
// within the windows of the caller's memberships. The windows are part of
// the engine's query, not a filter over its answer, so a page is full
// whenever enough hits exist.
package search

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Doc is one indexed message.
type Doc struct {
	ConvID uint64
	Seq    uint64
	MsgID  uint64
	Sender string
	Time   int64 // server time, unix ms
	// Kind is the message's kind: protocol.KindText, or
	// protocol.KindFile for a message with an attachment.
	Kind string
	Text string
}

// Key names a document.
type Key struct {
	ConvID uint64
	Seq    uint64
}

// Batch is one atomic change of the index: documents to put (replacing
// any of the same key), keys to delete (a missing one is no error), and
// watermarks to set (conversation → seq; a watermark never goes down: a
// lower value leaves the stored one).
type Batch struct {
	Put    []Doc
	Delete []Key
	Marks  map[uint64]uint64
}

// Empty reports whether b changes nothing.
func (b *Batch) Empty() bool { return len(b.Put) == 0 && len(b.Delete) == 0 && len(b.Marks) == 0 }

// Window is a range of one conversation's seqs a caller may see: From ≤
// seq ≤ To (To 0: no upper bound).
type Window struct {
	ConvID   uint64
	From, To uint64
}

// Order of a query's hits.
type Order uint8

const (
	// Newest: by server time, newest first (ties by conversation and seq,
	// highest first).
	Newest Order = iota
	// Relevance: best match first (ties as Newest).
	Relevance
)

// Query is a search. Text and Windows are required; the other filters are
// optional and combine with AND.
type Query struct {
	Text string
	// Windows bound the conversations and seqs searched: a hit lies in
	// one of them. At most MaxWindows.
	Windows []Window
	Sender  string
	// FromTime and ToTime bound the server time, unix ms, inclusive (0:
	// no bound).
	FromTime, ToTime int64
	// Kind keeps only messages of that kind (protocol.KindFile: messages
	// with an attachment); "" keeps all.
	Kind  string
	Order Order
	// Limit is the page size, 1 to MaxLimit.
	Limit int
	// Cursor is Result.Next of the previous page ("" for the first).
	Cursor string
}

// Hit is one matching message.
type Hit struct {
	ConvID uint64
	Seq    uint64
	MsgID  uint64
	Sender string
	Time   int64
	Score  float64
}

// Result is one page of hits; Next is the cursor of the page after it (""
// when this is the last page).
type Result struct {
	Hits []Hit
	Next string
}

// Index is the seam. Its methods are safe for concurrent use.
type Index interface {
	// Apply writes b atomically: after it returns nil the change is
	// searchable, and it survives a crash either at once or, in an engine
	// that persists in the background, with b's documents and watermarks
	// together, so a crash loses only whole batches from the last ones
	// applied (the watermarks that survive say what to index again);
	// after an error either all of b or none of it may be applied
	// (applying it again is harmless). Close persists what was applied.
	Apply(ctx context.Context, b Batch) error
	// Watermark returns the conversation's watermark (0: none).
	Watermark(ctx context.Context, convID uint64) (uint64, error)
	// Search answers a Query that Validate accepted; a Cursor it cannot
	// read is ErrBadCursor.
	Search(ctx context.Context, q Query) (Result, error)
	// Count returns how many documents the index holds for a conversation.
	Count(ctx context.Context, convID uint64) (uint64, error)
	// Close releases the index. It is safe to call twice.
	Close() error
}

// Errors of Validate and Search.
var (
	ErrEmpty        = errors.New("search: the query has no words")
	ErrTooLong      = errors.New("search: the query is too long")
	ErrTooManyTerms = errors.New("search: the query has too many terms")
	ErrBadCursor    = errors.New("search: bad cursor")
	ErrBadQuery     = errors.New("search: bad query")
	ErrClosed       = errors.New("search: index closed")
)

// Limits of a query (Validate). The defaults are the config's.
type Limits struct {
	MaxBytes   int // of Text
	MaxTerms   int // Terms(Text)
	MaxLimit   int
	MaxWindows int
}

// DefaultLimits are the limits without configuration.
var DefaultLimits = Limits{MaxBytes: 256, MaxTerms: 16, MaxLimit: 100, MaxWindows: 10000}

// Validate checks q against l: an error wraps one of the errors above.
func Validate(q Query, l Limits) error {
	if len(q.Text) > l.MaxBytes {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTooLong, len(q.Text), l.MaxBytes)
	}
	if !utf8.ValidString(q.Text) {
		return fmt.Errorf("%w: the text is not UTF-8", ErrBadQuery)
	}
	n := len(Terms(q.Text))
	if n == 0 {
		return ErrEmpty
	}
	if n > l.MaxTerms {
		return fmt.Errorf("%w: %d terms, at most %d", ErrTooManyTerms, n, l.MaxTerms)
	}
	if q.Limit < 1 || q.Limit > l.MaxLimit {
		return fmt.Errorf("%w: limit %d is not 1 to %d", ErrBadQuery, q.Limit, l.MaxLimit)
	}
	if len(q.Windows) > l.MaxWindows {
		return fmt.Errorf("%w: %d windows, at most %d", ErrBadQuery, len(q.Windows), l.MaxWindows)
	}
	if q.Order != Newest && q.Order != Relevance {
		return fmt.Errorf("%w: order %d", ErrBadQuery, q.Order)
	}
	if q.FromTime < 0 || q.ToTime < 0 || (q.ToTime != 0 && q.FromTime > q.ToTime) {
		return fmt.Errorf("%w: time range %d..%d", ErrBadQuery, q.FromTime, q.ToTime)
	}
	for _, w := range q.Windows {
		if w.ConvID == 0 || w.From == 0 || (w.To != 0 && w.To < w.From) {
			return fmt.Errorf("%w: window %+v", ErrBadQuery, w)
		}
	}
	if q.Cursor != "" {
		if _, err := DecodeCursor(q.Cursor, q.Order); err != nil {
			return err
		}
	}
	return nil
}

// isCJK reports whether r is written without spaces between words (Han,
// Hiragana, Katakana, Hangul): each such character is a term of its own.
func isCJK(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}

// Terms splits text the way queries count terms: a run of letters or
// digits is one term, and each CJK character is one. Matching is case
// insensitive, so the terms are lower-cased.
func Terms(text string) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	for _, r := range text {
		switch {
		case isCJK(r):
			flush()
			out = append(out, string(r))
		case unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			cur.WriteRune(unicode.ToLower(r))
		default:
			flush()
		}
	}
	flush()
	return out
}

// Cursor is the position after the last hit of a page: the sort values of
// that hit, which only the engine that produced them reads.
type Cursor struct {
	Order Order    `json:"o"`
	After []string `json:"a"`
}

// EncodeCursor makes c opaque.
func EncodeCursor(c Cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeCursor reads a cursor of a query in order o; ErrBadCursor if it is
// not one.
func DecodeCursor(s string, o Order) (Cursor, error) {
	var c Cursor
	if len(s) > 1024 {
		return c, fmt.Errorf("%w: too long", ErrBadCursor)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return c, fmt.Errorf("%w: %v", ErrBadCursor, err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%w: %v", ErrBadCursor, err)
	}
	if c.Order != o {
		return c, fmt.Errorf("%w: made for another order", ErrBadCursor)
	}
	if len(c.After) == 0 || len(c.After) > 4 || slices.ContainsFunc(c.After, func(v string) bool { return len(v) > 64 || !utf8.ValidString(v) }) {
		return c, fmt.Errorf("%w: malformed", ErrBadCursor)
	}
	return c, nil
}

// Highlight is a byte range [Start, End) of a snippet that matched.
type Highlight struct {
	Start, End int
}

// Snippet returns the part of text around the first match of the query's
// terms, at most about width runes, and the ranges of the snippet that
// match a term (case insensitive; a CJK character matches alone, so a
// Chinese phrase is highlighted character by character, merged where they
// touch).
func Snippet(text, query string, width int) (string, []Highlight) {
	terms := Terms(query)
	lower, offs := lowerMap(text)
	first := -1
	var spans []Highlight
	for _, t := range terms {
		for i := 0; ; {
			j := strings.Index(lower[i:], t)
			if j < 0 {
				break
			}
			s, e := i+j, i+j+len(t)
			spans = append(spans, Highlight{offs[s], offs[e]})
			if first < 0 || offs[s] < first {
				first = offs[s]
			}
			i = e
		}
	}
	// The window of text: start a little before the first match.
	start, end := 0, len(text)
	if utf8.RuneCountInString(text) > width {
		if first < 0 {
			first = 0
		}
		start = backRunes(text, first, width/4)
		end = start
		for n := 0; n < width && end < len(text); n++ {
			_, sz := utf8.DecodeRuneInString(text[end:])
			end += sz
		}
	}
	snip := text[start:end]
	slices.SortFunc(spans, func(a, b Highlight) int { return a.Start - b.Start })
	var hs []Highlight
	for _, h := range spans {
		if h.Start < start || h.End > end {
			continue
		}
		h.Start -= start
		h.End -= start
		if n := len(hs); n > 0 && h.Start <= hs[n-1].End {
			hs[n-1].End = max(hs[n-1].End, h.End)
			continue
		}
		hs = append(hs, h)
	}
	return snip, hs
}

// lowerMap lower-cases text rune by rune and maps each byte offset of the
// result (and its end) to the offset of the rune in text it came from.
func lowerMap(text string) (string, []int) {
	var b strings.Builder
	offs := make([]int, 0, len(text)+1)
	for i, r := range text {
		n := b.Len()
		b.WriteRune(unicode.ToLower(r))
		for k := n; k < b.Len(); k++ {
			offs = append(offs, i)
		}
	}
	offs = append(offs, len(text))
	return b.String(), offs
}

func backRunes(s string, i, n int) int {
	for ; n > 0 && i > 0; n-- {
		_, sz := utf8.DecodeLastRuneInString(s[:i])
		i -= sz
	}
	return i
}
