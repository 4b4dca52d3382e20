package protocol

import (
	"unicode/utf16"
	"unicode/utf8"
)

// Search of plain conversations (docs/protocol.md, "Search"): a search
// frame carries its query; the answer is a search frame with its result.
const TypeSearch = "search"

// Error codes of search.
const (
	CodeQueryTooLong      Code = "query_too_long"     // the search text is over search.max_query_bytes
	CodeQueryTooComplex   Code = "query_too_complex"  // the search text has more terms than search.max_query_terms
	CodeBadCursor         Code = "bad_cursor"         // the cursor is not one this server gave for the same order
	CodeSearchUnavailable Code = "search_unavailable" // this server has no search index (off, or a cluster node)
)

// Search orders.
const (
	OrderNewest    = "newest"
	OrderRelevance = "relevance"
)

// SearchQuery is what a search frame asks. Text is required; the rest
// narrows it. FromSeq and ToSeq need ConvID.
type SearchQuery struct {
	Text     string `json:"text"`
	ConvID   uint64 `json:"conv_id,omitempty,string"`
	Sender   string `json:"sender,omitempty"`
	FromSeq  uint64 `json:"from_seq,omitempty"`
	ToSeq    uint64 `json:"to_seq,omitempty"`
	FromTime int64  `json:"from_time,omitempty"`
	ToTime   int64  `json:"to_time,omitempty"`
	// Kind "file" keeps only messages with an attachment.
	Kind   string `json:"kind,omitempty"`
	Order  string `json:"order,omitempty"`
	Limit  int    `json:"limit,omitempty"`
	Cursor string `json:"cursor,omitempty"`
}

// SearchHit is one message found: a reference to it, with the part of
// its text around the match. Highlights are [start, end) offsets into
// Snippet in UTF-16 code units (as JavaScript indexes strings; HighlightBytes
// converts them for Go).
type SearchHit struct {
	ConvID     uint64   `json:"conv_id,string"`
	Seq        uint64   `json:"seq"`
	MsgID      uint64   `json:"msg_id,string"`
	Sender     string   `json:"sender"`
	ServerTime int64    `json:"server_time"`
	Kind       string   `json:"kind"`
	Snippet    string   `json:"snippet"`
	Highlights [][2]int `json:"highlights"`
	Score      float64  `json:"score,omitempty"`
}

// SearchResult is one page of hits; Cursor asks for the next page (absent
// after the last).
type SearchResult struct {
	Hits   []SearchHit `json:"hits"`
	Cursor string      `json:"cursor,omitempty"`
}

// DefaultSearchLimit is a search's page size when the query gives none.
const DefaultSearchLimit = 20

func validateSearch(f *Frame) *Error {
	q := f.Query
	if q == nil {
		return Errorf(CodeInvalidArgument, "search needs query")
	}
	if q.Text == "" {
		return Errorf(CodeInvalidArgument, "query.text is required")
	}
	if (q.FromSeq != 0 || q.ToSeq != 0) && q.ConvID == 0 {
		return Errorf(CodeInvalidArgument, "query.from_seq and to_seq need query.conv_id")
	}
	if q.ToSeq != 0 && q.FromSeq > q.ToSeq {
		return Errorf(CodeInvalidArgument, "query.from_seq is above to_seq")
	}
	if q.FromTime < 0 || q.ToTime < 0 || (q.ToTime != 0 && q.FromTime > q.ToTime) {
		return Errorf(CodeInvalidArgument, "query.from_time and to_time must be a range of unix milliseconds")
	}
	if q.Sender != "" && !ValidID(q.Sender) {
		return Errorf(CodeInvalidArgument, "query.sender is not a valid user id")
	}
	if q.Kind != "" && q.Kind != KindFile && q.Kind != KindText {
		return Errorf(CodeInvalidArgument, "query.kind must be text or file")
	}
	if q.Order == "" {
		q.Order = OrderNewest
	}
	if q.Order != OrderNewest && q.Order != OrderRelevance {
		return Errorf(CodeInvalidArgument, "query.order must be newest or relevance")
	}
	if q.Limit < 0 {
		return Errorf(CodeInvalidArgument, "query.limit must not be negative")
	}
	if q.Limit == 0 {
		q.Limit = DefaultSearchLimit
	}
	return nil
}

// UTF16Range converts a [start, end) byte range of s to UTF-16 code
// units.
func UTF16Range(s string, start, end int) [2]int {
	return [2]int{utf16Len(s[:start]), utf16Len(s[:end])}
}

func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n += utf16.RuneLen(r)
	}
	return n
}

// HighlightBytes converts a highlight of snippet (UTF-16 offsets) to a
// byte range of it; ok is false when it does not fit.
func HighlightBytes(snippet string, h [2]int) (start, end int, ok bool) {
	u, b := 0, 0
	start, end = -1, -1
	for b <= len(snippet) {
		if u == h[0] && start < 0 {
			start = b
		}
		if u == h[1] {
			end = b
			break
		}
		if b == len(snippet) {
			break
		}
		r, sz := utf8.DecodeRuneInString(snippet[b:])
		u += utf16.RuneLen(r)
		b += sz
	}
	return start, end, start >= 0 && end >= start
}
