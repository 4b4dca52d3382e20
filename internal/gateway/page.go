package gateway

import (
	"encoding/json"

	"github.com/parley-im/parley/protocol"
)

// Answers are paged, not cut: a connection's outbound queue holds at most
// OutboundQueueBytes and the connection is dropped beyond, so an answer
// larger than that (70 messages of 16 KiB) would end an HTTP body midway
// or drop a WebSocket that reads. A history or sync answer carries at
// most MaxHTTPAnswer bytes of messages, on the WebSocket as over HTTP;
// what is left out is announced the way the protocol pages anyway
// (history: has_more; sync: more_unread) and the client fetches it with
// history.

// MaxHTTPAnswer bounds one history or sync answer's size: half the
// outbound bound, so the queue always holds it whole beside pushes.
func (g *Gateway) MaxHTTPAnswer() int { return g.cfg.OutboundQueueBytes / 2 }

// fitAnswer pages a history or sync answer to MaxHTTPAnswer; forward: the
// history request read forward (after_seq).
func (g *Gateway) fitAnswer(resp *protocol.Frame, forward bool) {
	switch resp.Type {
	case protocol.TypeHistory:
		req := &protocol.Frame{}
		if forward {
			req.AfterSeq = new(uint64)
		}
		FitHistory(req, resp, g.MaxHTTPAnswer())
	case protocol.TypeSnapshot:
		FitSnapshot(resp.Snapshot, g.MaxHTTPAnswer())
	}
}

func jsonSize(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// FitHistory trims a history answer to about limit bytes. With after_seq
// (reading forward) the newest messages are left out, else the oldest;
// has_more then says more exist in that direction.
func FitHistory(req, resp *protocol.Frame, limit int) {
	if resp == nil || resp.Type != protocol.TypeHistory || len(resp.Messages) == 0 {
		return
	}
	over := jsonSize(resp) - limit
	if over <= 0 {
		return
	}
	forward := req.AfterSeq != nil
	for over > 0 && len(resp.Messages) > 0 {
		i := 0
		if forward {
			i = len(resp.Messages) - 1
		}
		over -= jsonSize(resp.Messages[i]) + 1
		if forward {
			resp.Messages = resp.Messages[:i]
		} else {
			resp.Messages = resp.Messages[1:]
		}
		resp.HasMore = true
	}
}

// FitSnapshot trims a sync answer to about limit bytes: the oldest
// messages of a conversation are left out first and counted in its
// more_unread, exactly as for a gap over the snapshot range; the client
// pages them with history before_seq.
func FitSnapshot(snap []protocol.ConvSnapshot, limit int) {
	over := jsonSize(snap) - limit
	for i := range snap {
		if over <= 0 {
			return
		}
		c := &snap[i]
		for over > 0 && len(c.Messages) > 0 {
			over -= jsonSize(c.Messages[0]) + 1
			c.Messages = c.Messages[1:]
			c.MoreUnread++
		}
	}
}
