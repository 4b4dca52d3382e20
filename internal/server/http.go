package server

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/protocol"
)

// handleSnapshot serves GET /v1/conversations/snapshot: the batch sync of
// the socket's sync frame, over plain HTTP.
func (s *Server) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := gateway.Authenticate(s.verifier, w, r, s.now())
	if !ok {
		return
	}
	convs, all, perr := ParseSnapshotQuery(r.URL.Query(), s.cfg.Limits)
	if perr != nil {
		writeError(w, perr)
		return
	}
	device := r.URL.Query().Get("device")
	if device != "" && !protocol.ValidID(device) {
		writeError(w, protocol.Errorf(protocol.CodeInvalidArgument, "device must be 1-64 bytes of [A-Za-z0-9._@-]"))
		return
	}
	if !s.gw.Authorize(w, r, id, device) {
		return
	}
	if perr := s.gw.AdmitSync(); perr != nil {
		w.Header().Set("Retry-After", strconv.FormatInt((perr.RetryAfter+999)/1000, 10))
		writeError(w, perr)
		return
	}
	// Through the backend, so a gateway-only node asks the chat tier.
	var resp *protocol.Frame
	s.backend.Handle(r.Context(), chat.Caller{User: id.User, Device: device}, &protocol.Frame{Type: protocol.TypeSync, Convs: convs, All: all}, func(f *protocol.Frame) { resp = f })
	switch {
	case resp == nil:
		writeError(w, protocol.Errorf(protocol.CodeInternal, "no answer"))
		return
	case resp.Type == protocol.TypeError:
		writeError(w, &protocol.Error{Code: resp.Code, Msg: resp.Error, RetryAfter: resp.RetryAfter})
		return
	}
	snap := resp.Snapshot
	if snap == nil {
		snap = []protocol.ConvSnapshot{}
	}
	gateway.FitSnapshot(snap, s.gw.MaxHTTPAnswer())
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Snapshot []protocol.ConvSnapshot `json:"snapshot"`
	}{snap})
}

// ParseSnapshotQuery reads conv_ids=1,2,3 and from_seq: one value for every
// conversation, or one per conversation in the same order. all=true adds
// every other conversation of the user from its read position; conv_ids may
// then be empty.
func ParseSnapshotQuery(q url.Values, lim protocol.Limits) ([]protocol.SyncConv, bool, *protocol.Error) {
	all := false
	switch q.Get("all") {
	case "", "false", "0":
	case "true", "1":
		all = true
	default:
		return nil, false, protocol.Errorf(protocol.CodeInvalidArgument, "all must be true or false")
	}
	ids, perr := parseUintList(q.Get("conv_ids"), "conv_ids", lim.MaxSyncConvs)
	if perr != nil {
		return nil, false, perr
	}
	if len(ids) == 0 && !all {
		return nil, false, protocol.Errorf(protocol.CodeInvalidArgument, "conv_ids or all=true is required")
	}
	froms, perr := parseUintList(q.Get("from_seq"), "from_seq", lim.MaxSyncConvs)
	if perr != nil {
		return nil, false, perr
	}
	if len(froms) > 1 && len(froms) != len(ids) {
		return nil, false, protocol.Errorf(protocol.CodeInvalidArgument, "from_seq has %d values for %d conv_ids; give one or one each", len(froms), len(ids))
	}
	seen := make(map[uint64]bool, len(ids))
	out := make([]protocol.SyncConv, len(ids))
	for i, id := range ids {
		if id == 0 {
			return nil, false, protocol.Errorf(protocol.CodeInvalidArgument, "conv_ids has a zero id")
		}
		if seen[id] {
			return nil, false, protocol.Errorf(protocol.CodeInvalidArgument, "conv_ids repeats %d", id)
		}
		seen[id] = true
		out[i].ConvID = id
		switch len(froms) {
		case 1:
			out[i].AfterSeq = froms[0]
		case len(ids):
			out[i].AfterSeq = froms[i]
		}
	}
	return out, all, nil
}

func parseUintList(s, name string, maxN int) ([]uint64, *protocol.Error) {
	if s == "" {
		return nil, nil
	}
	if n := strings.Count(s, ",") + 1; n > maxN {
		return nil, protocol.Errorf(protocol.CodeTooLarge, "%s has %d values, over %d", name, n, maxN)
	}
	parts := strings.Split(s, ",")
	out := make([]uint64, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 64)
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%s: %q is not a decimal number", name, p)
		}
		out[i] = v
	}
	return out, nil
}

// httpStatus maps error codes to HTTP statuses (docs/protocol.md).
func httpStatus(c protocol.Code) int { return protocol.HTTPStatus(c) }

func writeError(w http.ResponseWriter, e *protocol.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(e.Code))
	_ = json.NewEncoder(w).Encode(map[string]any{"code": e.Code, "error": e.Msg})
}
