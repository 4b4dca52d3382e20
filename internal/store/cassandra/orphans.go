package cassandra

import (
	"context"

	"github.com/parley-im/parley/internal/store"
)

// Orphan bodies: an owned append writes its body before its slot, so a
// body whose slot never counts stays in messages, invisible. Two cases
// are cleaned up where the owner knows the body can never show:
//
//   - a duplicate's body (the request resolved to the original, another
//     msg id): at once;
//   - the bodies of a batch whose slot write failed or was not confirmed:
//     at the owner's next load of the conversation, after its fence, a body
//     whose intended slot does not hold it is shadowed for good (above the
//     fenced top) or lost to another message (below it).
//
// A process that dies takes its list along: those bodies stay (no
// durable intent record: that would cost every append a write).

// maxOrphans bounds the bodies remembered per conversation.
const maxOrphans = 4 * maxBatch

// rememberOrphans keeps the slots msgs were meant to take, for the next
// load (o.mu not held).
func (s *Store) rememberOrphans(o *ownedConv, msgs []store.Message) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range msgs {
		if len(o.orphans) == maxOrphans {
			return
		}
		o.orphans = append(o.orphans, slot{seq: m.Seq, msgID: m.MsgID, bucket: s.bucketOf(m.ServerTime)})
	}
}

// dropOrphans deletes the remembered bodies whose slots do not hold them,
// once the fence above top is written (st.mu held). Best effort.
func (s *Store) dropOrphans(ctx context.Context, st *convState, top uint64) {
	o := &st.own
	o.mu.Lock()
	cands := o.orphans
	o.orphans = nil
	o.mu.Unlock()
	var gone []slot
	for _, c := range cands {
		if c.seq <= top {
			ss, err := s.slots(ctx, st.id, c.seq, c.seq, 1)
			if err != nil {
				s.log.Warn("cassandra: orphan bodies left", logKeyConv, st.id, logKeyErr, err)
				return
			}
			if len(ss) == 1 && ss[0].msgID == c.msgID {
				continue // the write landed: a stored message
			}
		}
		gone = append(gone, c)
	}
	s.dropBodies(ctx, st.id, gone)
}

// dropBodies deletes the bodies of ss, which no slot holds; best effort.
func (s *Store) dropBodies(ctx context.Context, conv uint64, ss []slot) {
	if len(ss) == 0 {
		return
	}
	err := s.each(ctx, len(ss), func(ctx context.Context, i int) error {
		return s.q(ctx, `DELETE FROM messages WHERE conv_id = ? AND bucket = ? AND message_id = ?`,
			i64(conv), ss[i].bucket, i64(ss[i].msgID)).Exec()
	})
	if err != nil {
		s.log.Warn("cassandra: orphan bodies left", logKeyConv, conv, logKeyErr, err)
	}
}
