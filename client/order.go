package client

import (
	"github.com/parley-im/parley/protocol"
)

// maxPending bounds the messages held per conversation while a hole is being
// fetched. A push beyond it is dropped: the history fetch, which repeats
// while has_more, brings it back.
const maxPending = 4096

// convOrder turns one conversation's pushes, snapshot entries and history
// pages into a stream in strictly increasing seq without duplicates or holes.
// It is pure bookkeeping without I/O: the dispatcher that owns it performs the
// fetches it asks for. Not safe for concurrent use.
type convOrder struct {
	// known is false until the conversation's starting point is established
	// (a stored position, a snapshot, or the conversation list's read
	// position); until then every message waits in pending.
	known bool
	// last is the highest seq handed on; everything ≤ last is a duplicate.
	last    uint64
	pending map[uint64]protocol.Message
	// fetching is true while a history request for this conversation is in
	// flight; fetchCover is the highest pending seq when it was sent, which
	// tells a hole the server cannot fill (seqs invisible to this member)
	// from one whose messages were stored after the page was read.
	fetching   bool
	fetchCover uint64
	// ack is the acknowledgement policy of the conversation's last push
	// (protocol.AckBatch, AckNone, or "": promptly).
	ack string
}

func newConvOrder(last uint64, known bool) *convOrder {
	return &convOrder{known: known, last: last, pending: make(map[uint64]protocol.Message)}
}

// offer takes one message and returns the messages now ready, in order.
func (o *convOrder) offer(m protocol.Message) []protocol.Message {
	if o.known && m.Seq <= o.last {
		return nil
	}
	if o.known && m.Seq == o.last+1 {
		o.last = m.Seq
		return o.drain([]protocol.Message{m})
	}
	if _, dup := o.pending[m.Seq]; dup || len(o.pending) >= maxPending {
		return nil
	}
	o.pending[m.Seq] = m
	return nil
}

// hole reports whether messages wait behind a missing seq (or behind an
// unknown starting point).
func (o *convOrder) hole() bool { return len(o.pending) > 0 }

// needFetch reports whether a history fetch should start now.
func (o *convOrder) needFetch() bool { return o.known && o.hole() && !o.fetching }

// startFetch marks a fetch in flight and returns its after_seq.
func (o *convOrder) startFetch() uint64 {
	o.fetching = true
	o.fetchCover = o.maxPendingSeq()
	return o.last
}

// fetchFailed clears the in-flight mark so the fetch can be retried.
func (o *convOrder) fetchFailed() { o.fetching = false }

// fill applies one history page (ascending) fetched with after_seq. It returns
// the ready messages, whether another page must be fetched, and how many
// seqs were jumped over because the server cannot show them to this member.
func (o *convOrder) fill(msgs []protocol.Message, hasMore bool) (ready []protocol.Message, again bool, skipped uint64) {
	o.fetching = false
	before := o.last
	for _, m := range msgs {
		ready = append(ready, o.offer(m)...)
	}
	if hasMore {
		return ready, true, 0
	}
	if !o.hole() {
		return ready, false, 0
	}
	low := o.minPendingSeq()
	if o.last == before && low <= o.fetchCover {
		// The page was read after seq `low` was stored and still has
		// nothing between last and low: those seqs do not exist for us.
		var more []protocol.Message
		more, skipped = o.jumpTo(low - 1)
		ready = append(ready, more...)
		return ready, o.hole(), skipped
	}
	// Messages past the page's end were stored after it was read.
	return ready, true, 0
}

// jumpTo moves the starting point forward to base (snapshot with
// more_unread, or the first sight of a conversation) and returns what became
// ready and how many seqs were skipped. It never moves backwards.
func (o *convOrder) jumpTo(base uint64) (ready []protocol.Message, skipped uint64) {
	if !o.known {
		o.known = true
		o.last = base
	} else {
		if base <= o.last {
			return nil, 0
		}
		skipped = base - o.last
		o.last = base
	}
	for s := range o.pending {
		if s <= o.last {
			delete(o.pending, s)
		}
	}
	return o.drain(nil), skipped
}

// releaseAll gives up on every hole and hands over everything held.
func (o *convOrder) releaseAll() []protocol.Message {
	var ready []protocol.Message
	for o.hole() {
		more, _ := o.jumpTo(o.minPendingSeq() - 1)
		ready = append(ready, more...)
	}
	return ready
}

func (o *convOrder) drain(ready []protocol.Message) []protocol.Message {
	for {
		m, ok := o.pending[o.last+1]
		if !ok {
			return ready
		}
		delete(o.pending, m.Seq)
		o.last = m.Seq
		ready = append(ready, m)
	}
}

func (o *convOrder) minPendingSeq() uint64 {
	var low uint64
	for s := range o.pending {
		if low == 0 || s < low {
			low = s
		}
	}
	return low
}

func (o *convOrder) maxPendingSeq() uint64 {
	var high uint64
	for s := range o.pending {
		if s > high {
			high = s
		}
	}
	return high
}
