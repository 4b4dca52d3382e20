package chat

import (
	"context"
	"errors"

	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// snippetRunes is about how long a hit's snippet is.
const snippetRunes = 80

// searchFrame answers a search: the caller's membership windows (one
// conversation's when the query names it, else every conversation the
// caller is or was a member of) go into the engine's query, so a removed
// member finds nothing said after it left and a late joiner nothing from
// before it joined. Each hit's snippet comes from the stored message, as
// the caller may read it (a former member's as of its leave).
func (s *Service) searchFrame(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	res, perr := s.runSearch(ctx, c.User, *f.Query)
	if perr != nil {
		return nil, perr
	}
	return &protocol.Frame{Type: protocol.TypeSearch, Search: res}, nil
}

// AdminSearch is the server API's search. With user, it answers what
// that user's search frame would (the user's windows); without, it
// searches the one conversation the query must name, all of it, as the
// operator (moderation). q has passed protocol.Validate.
func (s *Service) AdminSearch(ctx context.Context, user string, q protocol.SearchQuery) (*protocol.SearchResult, *protocol.Error) {
	if user == "" && q.ConvID == 0 {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a search without user_id needs query.conv_id")
	}
	return s.runSearch(ctx, user, q)
}

// runSearch runs q for user ("" : the operator, in q.ConvID only).
func (s *Service) runSearch(ctx context.Context, user string, q protocol.SearchQuery) (*protocol.SearchResult, *protocol.Error) {
	if s.search == nil {
		return nil, protocol.Errorf(protocol.CodeSearchUnavailable, "this server has no search index")
	}
	leaves := map[uint64]uint64{}
	var ws []search.Window
	if q.ConvID != 0 {
		cv, err := s.store.Conversation(ctx, q.ConvID)
		if err != nil {
			return nil, s.storeErr("search", err)
		}
		var m store.Member // the operator: the whole conversation
		if user != "" {
			var perr *protocol.Error
			if m, perr = s.member(ctx, user, q.ConvID); perr != nil {
				return nil, perr
			}
		}
		if cv.E2E {
			return nil, protocol.Errorf(protocol.CodeE2EUnsupported, "an end-to-end encrypted conversation is searched on the device, never on the server")
		}
		if w, ok := window(q.ConvID, m.JoinSeq, m.LeaveSeq, q.FromSeq, q.ToSeq); ok {
			ws = append(ws, w)
		}
		leaves[q.ConvID] = m.LeaveSeq
	} else {
		rows, err := s.store.UserConversations(ctx, user)
		if err != nil {
			return nil, s.storeErr("search", err)
		}
		for _, r := range rows {
			if w, ok := window(r.ConvID, r.JoinSeq, r.LeaveSeq, 0, 0); ok {
				ws = append(ws, w)
			}
			leaves[r.ConvID] = r.LeaveSeq
		}
		if len(ws) > s.searchLimits.MaxWindows {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "member of %d conversations: over search.max_windows (%d), name one with query.conv_id", len(ws), s.searchLimits.MaxWindows)
		}
	}
	sq := search.Query{Text: q.Text, Windows: ws, Sender: q.Sender, FromTime: q.FromTime, ToTime: q.ToTime,
		Kind: q.Kind, Limit: q.Limit, Cursor: q.Cursor}
	if q.Order == protocol.OrderRelevance {
		sq.Order = search.Relevance
	}
	if err := search.Validate(sq, s.searchLimits); err != nil {
		return nil, searchErr(err)
	}
	if len(ws) == 0 {
		return &protocol.SearchResult{}, nil
	}
	res, err := s.search.Search(ctx, sq)
	if err != nil {
		if pe := searchErr(err); pe.Code != protocol.CodeInternal {
			return nil, pe
		}
		s.log.Error("search failed", "err", err)
		return nil, protocol.Errorf(protocol.CodeSearchUnavailable, "the search index failed")
	}
	out := &protocol.SearchResult{Cursor: res.Next, Hits: make([]protocol.SearchHit, 0, len(res.Hits))}
	for _, h := range res.Hits {
		ms, err := s.store.Messages(ctx, h.ConvID, h.Seq, h.Seq, 1)
		if err == nil {
			err = s.asOfLeave(ctx, h.ConvID, leaves[h.ConvID], ms)
		}
		if err != nil {
			return nil, s.storeErr("search", err)
		}
		if len(ms) == 0 {
			continue
		}
		m := ms[0]
		text, ok := search.TextOf(m)
		if !ok {
			continue // recalled since the index was written
		}
		snip, hs := search.Snippet(text, q.Text, snippetRunes)
		if leaves[h.ConvID] != 0 && len(hs) == 0 {
			// The index holds the current text; a former member reads
			// the message as of its leave, which an edit after it
			// changed: the match is not the member's to see.
			continue
		}
		hl := make([][2]int, 0, len(hs))
		for _, r := range hs {
			hl = append(hl, protocol.UTF16Range(snip, r.Start, r.End))
		}
		hit := protocol.SearchHit{ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, Sender: m.Sender, ServerTime: m.ServerTime,
			Kind: m.Kind, Snippet: snip, Highlights: hl}
		if sq.Order == search.Relevance {
			hit.Score = h.Score
		}
		out.Hits = append(out.Hits, hit)
	}
	return out, nil
}

// window is the part of a conversation a member may search: its
// membership (join_seq up to leave_seq) within the query's seq range.
func window(conv, join, leave, from, to uint64) (search.Window, bool) {
	w := search.Window{ConvID: conv, From: max(join, from, 1), To: leave}
	if to != 0 && (w.To == 0 || to < w.To) {
		w.To = to
	}
	if w.To != 0 && w.To < w.From {
		return w, false
	}
	return w, true
}

// searchErr maps the search package's errors to codes.
func searchErr(err error) *protocol.Error {
	switch {
	case errors.Is(err, search.ErrTooLong):
		return protocol.Errorf(protocol.CodeQueryTooLong, "%v", err)
	case errors.Is(err, search.ErrTooManyTerms):
		return protocol.Errorf(protocol.CodeQueryTooComplex, "%v", err)
	case errors.Is(err, search.ErrBadCursor):
		return protocol.Errorf(protocol.CodeBadCursor, "%v", err)
	case errors.Is(err, search.ErrEmpty), errors.Is(err, search.ErrBadQuery):
		return protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return protocol.Errorf(protocol.CodeTimeout, "search: %v", err)
	}
	return protocol.Errorf(protocol.CodeInternal, "%v", err)
}
