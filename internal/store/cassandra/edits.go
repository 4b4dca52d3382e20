package cassandra

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// Edits and recalls are all-or-nothing for readers (see "Edits and
// recalls" in the package comment). The target's edit column holds an
// editRecord: the committed version and, while its event is being stored,
// the pending one with the event's identity. Readers apply the pending
// version only once a slot holds the event; the writer promotes it after
// the event's slot is committed (owned: confirmed), and a sweeper (sweep,
// run when an owner loads a conversation) promotes what a crash left.

// editRecord is what a message's edit column holds.
type editRecord struct {
	editImage // the committed version, unless Orig
	// Orig: no edit committed yet; the row's own columns are current.
	Orig    bool         `json:"o,omitempty"`
	Pending *pendingEdit `json:"p,omitempty"`
}

// pendingEdit is a version whose event is not known to be stored.
type pendingEdit struct {
	Image editImage `json:"i"`
	Event uint64    `json:"m"`           // the event's msg id
	Seq   uint64    `json:"q,omitempty"` // owned appends: the event's seq
	From  uint64    `json:"f,omitempty"` // transactional: the event's seq is ≥ From
	At    int64     `json:"t,omitempty"` // unix ms when it was written
}

// pendingAge is how long a transactional append may take between its
// pending version and its seq claim: an uncommitted pending version
// older than that is abandoned (its writer died). Owned appends need no
// age: the owner's fence settles it.
const pendingAge = 30 * time.Second

// committed reports whether p's event is stored: a slot holds it.
func (s *Store) committed(ctx context.Context, conv uint64, p *pendingEdit) (bool, error) {
	if p.Seq != 0 {
		ss, err := s.slots(ctx, conv, p.Seq, p.Seq, 1)
		return err == nil && len(ss) == 1 && ss[0].seq == p.Seq && ss[0].msgID == p.Event, err
	}
	at, _, err := s.find(ctx, conv, max(p.From, 1), p.Event)
	return at != 0, err
}

// resolve returns m (its committed version) with p applied if p's event
// is stored.
func (s *Store) resolve(ctx context.Context, conv uint64, m store.Message, p *pendingEdit) (store.Message, error) {
	if p == nil {
		return m, nil
	}
	ok, err := s.committed(ctx, conv, p)
	if err != nil || !ok {
		return m, err
	}
	return p.Image.apply(m), nil
}

// rewrite is a target rewritten with a pending version.
type rewrite struct {
	sl  slot
	rev int
	rec editRecord    // as written (with Pending)
	msg store.Message // the target as the event makes it
}

// casEdit stores rec in sl's edit column at rev, if the column is still
// at the rev before it. An unknown outcome is settled by a SERIAL read.
func (s *Store) casEdit(ctx context.Context, conv uint64, sl slot, rev int, cond any, rec editRecord) (bool, error) {
	img, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	seen := map[string]any{}
	applied, err := s.lwt(ctx, `UPDATE messages SET rev = ?, edit = ? WHERE conv_id = ? AND bucket = ? AND message_id = ? IF rev = ?`,
		rev, img, i64(conv), sl.bucket, i64(sl.msgID), cond).MapScanCAS(seen)
	if err == nil {
		return applied, nil
	}
	var (
		gotRev *int
		gotImg []byte
	)
	rerr := s.serialRead(ctx, `SELECT rev, edit FROM messages WHERE conv_id = ? AND bucket = ? AND message_id = ?`,
		i64(conv), sl.bucket, i64(sl.msgID)).Scan(&gotRev, &gotImg)
	if rerr != nil {
		return false, errors.Join(err, rerr)
	}
	return gotRev != nil && *gotRev == rev && bytes.Equal(gotImg, img), nil
}

// promote makes w's pending version the committed one, unless the row
// moved on (whoever moved it resolved the pending version first). A
// failure is logged (and returned): readers resolve the pending version
// meanwhile.
func (s *Store) promote(ctx context.Context, conv uint64, w *rewrite) error {
	rec := editRecord{editImage: w.rec.Pending.Image}
	_, err := s.casEdit(ctx, conv, w.sl, w.rev+1, w.rev, rec)
	if err != nil {
		s.log.Warn("cassandra: edit: promotion left to readers and the sweeper", logKeyConv, conv, logKeySeq, w.msg.Seq, logKeyErr, err)
	}
	return err
}

// unpend withdraws w's pending version, whose event will never be
// stored, unless the row moved on; best effort (readers ignore a pending
// version without its event, and the next edit drops it).
func (s *Store) unpend(ctx context.Context, conv uint64, w *rewrite) {
	if w == nil {
		return
	}
	rec := w.rec
	rec.Pending = nil
	if _, err := s.casEdit(ctx, conv, w.sl, w.rev+1, w.rev, rec); err != nil {
		s.log.Warn("cassandra: edit: a pending version left to the next edit", logKeyConv, conv, logKeySeq, w.msg.Seq, logKeyErr, err)
	}
}

// promoteFor promotes the pending version of target whose event is
// event, if it is still there (the sweeper: the event is stored).
func (s *Store) promoteFor(ctx context.Context, conv, target, event uint64) error {
	ss, err := s.slots(ctx, conv, target, target, 1)
	if err != nil || len(ss) == 0 {
		return err
	}
	sl := ss[0]
	r, err := s.readRow(ctx, conv, sl.bucket, sl.msgID)
	if err != nil {
		return err
	}
	_, p, err := r.message(conv, target)
	if err != nil || p == nil || p.Event != event || r.rev == nil {
		return err
	}
	_, err = s.casEdit(ctx, conv, sl, *r.rev+1, *r.rev, editRecord{editImage: p.Image})
	return err
}

// sweep finishes the effects of stored messages msgs (the last batch of
// a conversation, whose writer may have died or failed between its slots
// and its effects): it promotes the pending versions of the targets of
// their edits and recalls, raises their coalesce keys and the last_seq
// hint. Each step is idempotent, and a stored event's effects are always
// right to apply.
func (s *Store) sweep(ctx context.Context, conv uint64, msgs []store.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	keys := map[string]uint64{}
	for _, m := range msgs {
		if m.CoalesceKey != "" {
			keys[m.CoalesceKey] = m.Seq
		}
		if m.TargetSeq != 0 {
			if err := s.promoteFor(ctx, conv, m.TargetSeq, m.MsgID); err != nil {
				return fmt.Errorf("sweep: promote %d: %w", m.TargetSeq, err)
			}
		}
	}
	for k, seq := range keys {
		if err := s.q(ctx, `UPDATE coalesce_latest USING TIMESTAMP ? SET seq = ? WHERE conv_id = ? AND key = ?`,
			i64(seq), i64(seq), i64(conv), k).Exec(); err != nil {
			return fmt.Errorf("sweep: coalesce: %w", err)
		}
	}
	top := msgs[len(msgs)-1].Seq
	return s.q(ctx, `UPDATE conversations USING TIMESTAMP ? SET last_seq = ? WHERE conv_id = ?`,
		i64(top), i64(top), i64(conv)).Exec()
}

// fault is a test hook: a non-nil error at a named point of an append
// stops it there, as if the process died (the error is returned).
func (s *Store) fault(point string) error {
	if f := s.faultHook.Load(); f != nil {
		return (*f)(point)
	}
	return nil
}
