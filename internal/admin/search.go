package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// ReindexRoute rebuilds the search index (Deps.Reindex); its answer is a
// stream of JSON lines, not one JSON value.
const ReindexRoute = "POST /v1/admin/search/reindex"

type (
	searchReq struct {
		// UserID searches as that user (the user's membership windows);
		// empty, the query must name a conversation, searched whole.
		UserID string               `json:"user_id,omitempty"`
		Query  protocol.SearchQuery `json:"query"`
	}
	searchAnswer struct {
		Search *protocol.SearchResult `json:"search"`
	}
	reindexReq struct {
		// ConvID rebuilds one conversation; empty, every plain one.
		ConvID string `json:"conv_id,omitempty"`
	}
	// ReindexLine is one line of the reindex stream: progress lines, then
	// a last line with Done or Error.
	ReindexLine struct {
		Progress *ReindexCount `json:"progress,omitempty"`
		Done     *ReindexCount `json:"done,omitempty"`
		Error    *LineError    `json:"error,omitempty"`
	}
	// ReindexCount is how far a reindex got: conversations and messages
	// done, of the totals counted when it started (conversations created
	// since are indexed by the indexer, not counted here).
	ReindexCount struct {
		Conversations      int   `json:"conversations"`
		Messages           int64 `json:"messages"`
		TotalConversations int   `json:"total_conversations"`
		TotalMessages      int64 `json:"total_messages"`
	}
	// LineError is an error on a stream's last line.
	LineError struct {
		Code  protocol.Code `json:"code"`
		Error string        `json:"error"`
	}
)

func (s *Server) search(ctx context.Context, _ *http.Request, body []byte) (any, *protocol.Error) {
	var req searchReq
	if perr := decode(body, &req); perr != nil {
		return nil, perr
	}
	if req.UserID != "" && !protocol.ValidID(req.UserID) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "user_id %q is not 1-64 bytes of [A-Za-z0-9._@-]", truncate(req.UserID))
	}
	q := req.Query
	if perr := protocol.Validate(&protocol.Frame{Type: protocol.TypeSearch, Query: &q}, s.d.Limits); perr != nil {
		return nil, perr
	}
	res, perr := s.d.Chat.AdminSearch(ctx, req.UserID, q)
	if perr != nil {
		return nil, perr
	}
	return searchAnswer{res}, nil
}

// reindex runs Deps.Reindex, writing a progress line after each
// conversation. Once the first line is out the status is 200 whatever
// follows; the last line says how it ended.
func (s *Server) reindex(w http.ResponseWriter, r *http.Request) {
	body, perr := readBody(r)
	if perr != nil {
		writeError(w, perr)
		return
	}
	var req reindexReq
	if perr := decode(body, &req); perr != nil {
		writeError(w, perr)
		return
	}
	var conv uint64
	if req.ConvID != "" {
		id, err := strconv.ParseUint(req.ConvID, 10, 64)
		if err != nil || id == 0 {
			writeError(w, protocol.Errorf(protocol.CodeInvalidArgument, "conv_id %q is not a decimal conversation id", truncate(req.ConvID)))
			return
		}
		conv = id
	}
	if s.d.Reindex == nil {
		writeError(w, protocol.Errorf(protocol.CodeSearchUnavailable, "this node has no search index to rebuild"))
		return
	}
	// A whole store's reindex outlasts the API's write timeout.
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	s.d.Logger.Info("admin API call", "method", r.Method, "path", r.URL.Path, "conv_id", conv, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	line := func(l ReindexLine) {
		_ = enc.Encode(l)
		_ = rc.Flush()
	}
	line(ReindexLine{Progress: &ReindexCount{}}) // started
	p, err := s.d.Reindex(r.Context(), conv, func(p search.ReindexProgress) {
		line(ReindexLine{Progress: countOf(p)})
	})
	if err != nil {
		s.d.Logger.Error("admin API: reindex failed", "conv_id", conv, "err", err)
		line(ReindexLine{Error: reindexErr(err)})
		return
	}
	line(ReindexLine{Done: countOf(p)})
}

func countOf(p search.ReindexProgress) *ReindexCount {
	return &ReindexCount{Conversations: p.Conversations, Messages: p.Messages,
		TotalConversations: p.TotalConversations, TotalMessages: p.TotalMessages}
}

func reindexErr(err error) *LineError {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return &LineError{Code: pe.Code, Error: pe.Msg}
	case errors.Is(err, store.ErrNotFound):
		return &LineError{Code: protocol.CodeNotFound, Error: "no such conversation"}
	case errors.Is(err, search.ErrE2E):
		return &LineError{Code: protocol.CodeE2EUnsupported, Error: err.Error()}
	case errors.Is(err, context.Canceled):
		return &LineError{Code: protocol.CodeTimeout, Error: "the reindex was cancelled"}
	}
	return &LineError{Code: protocol.CodeInternal, Error: err.Error()}
}
