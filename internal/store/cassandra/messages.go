package cassandra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

var errCorrupt = errors.New("corrupt data")

// slot is a message_seq row.
type slot struct {
	seq    uint64
	msgID  uint64
	bucket int32
}

// bucketOf maps a message's server time to its time bucket. Times before the
// epoch land in bucket 0 and times past the u32 range in the last bucket
// (the int column holds the u32's bits), as in store/pebble.
func (s *Store) bucketOf(serverTimeMS int64) int32 {
	if serverTimeMS <= 0 {
		return 0
	}
	b := serverTimeMS / s.bucketMS
	if b > math.MaxUint32 {
		b = math.MaxUint32
	}
	return int32(uint32(b))
}

// blockOf is the message_seq partition of seq.
func (s *Store) blockOf(seq uint64) int64 { return i64(seq / s.block) }

// maxSeq bounds scans: a seq is a CQL bigint.
const maxSeq = math.MaxInt64

// top returns the highest claimed seq of st's conversation. It starts at
// the hint's block; blocks fill in order, so only a full block sends it to
// the next one.
func (s *Store) top(ctx context.Context, st *convState) (uint64, error) {
	h := st.hint.Load()
	for b := h / s.block; ; b++ {
		var seq int64
		err := s.q(ctx, `SELECT seq FROM message_seq WHERE conv_id = ? AND seq_block = ? ORDER BY seq DESC LIMIT 1`,
			i64(st.id), i64(b)).Scan(&seq)
		if errors.Is(err, gocql.ErrNotFound) {
			break
		}
		if err != nil {
			return 0, err
		}
		h = max(h, u64(seq))
		if u64(seq) != (b+1)*s.block-1 {
			break
		}
	}
	st.raiseHint(h)
	return h, nil
}

// slots returns up to limit slots with lo ≤ seq ≤ hi, lowest first. Slots
// are dense, so a block that returns fewer rows than its range holds ends
// the scan.
func (s *Store) slots(ctx context.Context, conv, lo, hi uint64, limit int) ([]slot, error) {
	lo = max(lo, 1)
	hi = min(hi, maxSeq)
	var out []slot
	for lo <= hi && len(out) < limit {
		end := min(hi, (lo/s.block+1)*s.block-1)
		want := min(uint64(limit-len(out)), end-lo+1)
		iter := s.q(ctx, `SELECT seq, message_id, bucket FROM message_seq
			WHERE conv_id = ? AND seq_block = ? AND seq >= ? AND seq <= ? LIMIT ?`,
			i64(conv), s.blockOf(lo), i64(lo), i64(end), int(want)).Iter()
		var (
			seq, id int64
			bucket  int32
			n       uint64
		)
		for iter.Scan(&seq, &id, &bucket) {
			out = append(out, slot{seq: u64(seq), msgID: u64(id), bucket: bucket})
			n++
		}
		if err := iter.Close(); err != nil {
			return nil, err
		}
		if n < want || end == maxSeq {
			break
		}
		lo = end + 1
	}
	return out, nil
}

// find walks the slots from lo up to the top and returns the seq holding
// msgID (0 if none) and the highest seq it saw (lo-1 if none).
func (s *Store) find(ctx context.Context, conv, lo, msgID uint64) (at, top uint64, err error) {
	const page = 1024
	top = lo - 1
	for {
		ss, err := s.slots(ctx, conv, top+1, maxSeq, page)
		if err != nil {
			return 0, 0, err
		}
		for _, sl := range ss {
			if sl.msgID == msgID {
				return sl.seq, max(top, sl.seq), nil
			}
			top = sl.seq
		}
		if len(ss) < page {
			return 0, top, nil
		}
	}
}

// messageColumns are the columns decodeMessage reads, in its order.
const messageColumns = `message_id, sender, sender_device, client_msg_id, kind, body, target_seq, server_time,
	mentions, mention_all, coalesce_key, rev, edit, attachment, reply_to`

// row is a messages row as scanned.
type row struct {
	id, target, time int64
	sender, device   string
	cmid, kind, body string
	mentions         []string
	mentionAll       bool
	key              string
	rev              *int
	edit             []byte
	attachment       *int64
	replyTo          *int64
}

func (r *row) dest() []any {
	return []any{&r.id, &r.sender, &r.device, &r.cmid, &r.kind, &r.body, &r.target, &r.time,
		&r.mentions, &r.mentionAll, &r.key, &r.rev, &r.edit, &r.attachment, &r.replyTo}
}

// message returns the row as seq's message with its committed edit
// applied, and the edit pending on it (nil: none), which applies only if
// its event is stored (Store.resolve).
func (r *row) message(conv, seq uint64) (store.Message, *pendingEdit, error) {
	m := store.Message{
		ConvID: conv, Seq: seq, MsgID: u64(r.id), Sender: r.sender, SenderDevice: r.device,
		ClientMsgID: r.cmid, Kind: r.kind, Body: r.body, TargetSeq: u64(r.target), ServerTime: r.time,
		Mentions: cloneMentions(r.mentions), MentionAll: r.mentionAll, CoalesceKey: r.key,
	}
	if r.attachment != nil {
		m.Attachment = u64(*r.attachment)
	}
	if r.replyTo != nil {
		m.ReplyTo = u64(*r.replyTo)
	}
	if r.rev == nil || len(r.edit) == 0 {
		return m, nil, nil
	}
	var e editRecord
	if err := json.Unmarshal(r.edit, &e); err != nil {
		return store.Message{}, nil, fmt.Errorf("message %d: edit: %w: %w", m.MsgID, errCorrupt, err)
	}
	if !e.Orig {
		m = e.apply(m)
	}
	return m, e.Pending, nil
}

// editImage is a message's content after edits and recalls: everything but
// its identity (conversation, seq, msg id, server time) and CoalesceKey.
type editImage struct {
	Sender       string   `json:"s"`
	SenderDevice string   `json:"d,omitempty"`
	ClientMsgID  string   `json:"c,omitempty"`
	Kind         string   `json:"k"`
	Body         string   `json:"b,omitempty"`
	TargetSeq    uint64   `json:"t,omitempty"`
	Edited       bool     `json:"e,omitempty"`
	Recalled     bool     `json:"r,omitempty"`
	Mentions     []string `json:"m,omitempty"`
	MentionAll   bool     `json:"a,omitempty"`
	// Attachment: images written before messages named attachments have
	// none, as those messages had none.
	Attachment uint64 `json:"f,omitempty"`
	// Reactions: the counts (store.Message.Reactions).
	Reactions []reactionCount `json:"x,omitempty"`
}

// reactionCount is one emoji's count in an edit image.
type reactionCount struct {
	Emoji string `json:"e"`
	Count int    `json:"n"`
}

func imageOf(m store.Message) editImage {
	return editImage{Sender: m.Sender, SenderDevice: m.SenderDevice, ClientMsgID: m.ClientMsgID, Kind: m.Kind,
		Body: m.Body, TargetSeq: m.TargetSeq, Edited: m.Edited, Recalled: m.Recalled,
		Mentions: cloneMentions(m.Mentions), MentionAll: m.MentionAll, Attachment: m.Attachment,
		Reactions: countsOf(m.Reactions)}
}

func countsOf(rs []store.Reaction) []reactionCount {
	if len(rs) == 0 {
		return nil
	}
	out := make([]reactionCount, len(rs))
	for i, r := range rs {
		out[i] = reactionCount(r)
	}
	return out
}

func (e editImage) apply(m store.Message) store.Message {
	m.Sender, m.SenderDevice, m.ClientMsgID, m.Kind = e.Sender, e.SenderDevice, e.ClientMsgID, e.Kind
	m.Body, m.TargetSeq, m.Edited, m.Recalled = e.Body, e.TargetSeq, e.Edited, e.Recalled
	m.Mentions, m.MentionAll = cloneMentions(e.Mentions), e.MentionAll
	m.Attachment = e.Attachment
	m.Reactions = nil
	if len(e.Reactions) > 0 && !e.Recalled {
		m.Reactions = make([]store.Reaction, len(e.Reactions))
		for i, r := range e.Reactions {
			m.Reactions[i] = store.Reaction(r)
		}
	}
	return m
}

// readRow reads one messages row.
func (s *Store) readRow(ctx context.Context, conv uint64, bucket int32, msgID uint64) (row, error) {
	var r row
	err := s.q(ctx, `SELECT `+messageColumns+` FROM messages WHERE conv_id = ? AND bucket = ? AND message_id = ?`,
		i64(conv), bucket, i64(msgID)).Scan(r.dest()...)
	return r, err
}

// messageAt reads the message in slot sl.
func (s *Store) messageAt(ctx context.Context, conv uint64, sl slot) (store.Message, error) {
	r, err := s.readRow(ctx, conv, sl.bucket, sl.msgID)
	if errors.Is(err, gocql.ErrNotFound) {
		return store.Message{}, fmt.Errorf("message %d of seq %d: %w", sl.msgID, sl.seq, errCorrupt)
	}
	if err != nil {
		return store.Message{}, err
	}
	m, p, err := r.message(conv, sl.seq)
	if err != nil {
		return store.Message{}, err
	}
	return s.resolve(ctx, conv, m, p)
}

// bodies reads the messages of ss, one IN query per bucket (in parallel),
// and returns them in the order of ss.
func (s *Store) bodies(ctx context.Context, conv uint64, ss []slot) ([]store.Message, error) {
	const maxIn = 100 // keeps the coordinator's IN fan-in modest
	type chunk struct {
		bucket int32
		ids    []int64
	}
	var chunks []chunk
	byBucket := map[int32]int{} // bucket → index of its open chunk
	for _, sl := range ss {
		i, ok := byBucket[sl.bucket]
		if !ok || len(chunks[i].ids) == maxIn {
			chunks = append(chunks, chunk{bucket: sl.bucket})
			i = len(chunks) - 1
			byBucket[sl.bucket] = i
		}
		chunks[i].ids = append(chunks[i].ids, i64(sl.msgID))
	}
	rows := make([]map[uint64]row, len(chunks))
	err := s.each(ctx, len(chunks), func(ctx context.Context, i int) error {
		c := chunks[i]
		iter := s.q(ctx, `SELECT `+messageColumns+` FROM messages WHERE conv_id = ? AND bucket = ? AND message_id IN ?`,
			i64(conv), c.bucket, c.ids).Iter()
		got := make(map[uint64]row, len(c.ids))
		var r row
		for iter.Scan(r.dest()...) {
			got[u64(r.id)] = r
			r = row{}
		}
		rows[i] = got
		return iter.Close()
	})
	if err != nil {
		return nil, err
	}
	all := rows[0]
	for _, got := range rows[1:] {
		for id, r := range got {
			all[id] = r
		}
	}
	out := make([]store.Message, 0, len(ss))
	for _, sl := range ss {
		r, found := all[sl.msgID]
		if !found {
			return nil, fmt.Errorf("message %d of seq %d: %w", sl.msgID, sl.seq, errCorrupt)
		}
		m, p, err := r.message(conv, sl.seq)
		if err == nil {
			m, err = s.resolve(ctx, conv, m, p) // rare: an edit in progress, or left by a crash
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// Messages returns the messages with from ≤ seq ≤ to, lowest first, at most
// limit (limit ≤ 0 returns none).
func (s *Store) Messages(ctx context.Context, convID, from, to uint64, limit int) ([]store.Message, error) {
	const op = "messages"
	msgs, err := s.messages(ctx, convID, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return msgs, nil
}

func (s *Store) messages(ctx context.Context, conv, from, to uint64, limit int) ([]store.Message, error) {
	if err := s.check(ctx, conv); err != nil {
		return nil, err
	}
	if limit <= 0 || from > to {
		return nil, nil
	}
	ss, err := s.slots(ctx, conv, from, to, limit)
	if err != nil || len(ss) == 0 {
		return nil, err
	}
	return s.read(ctx, conv, ss)
}

// read returns the messages of ss with superseded states blanked.
func (s *Store) read(ctx context.Context, conv uint64, ss []slot) ([]store.Message, error) {
	msgs, err := s.bodies(ctx, conv, ss)
	if err == nil {
		err = s.supersede(ctx, conv, msgs)
	}
	return msgs, err
}

// supersede marks the state messages among msgs that a later message with
// the same coalesce key replaced, and empties their bodies.
func (s *Store) supersede(ctx context.Context, conv uint64, msgs []store.Message) error {
	var keys []string
	for _, m := range msgs {
		if m.CoalesceKey != "" && !slices.Contains(keys, m.CoalesceKey) {
			keys = append(keys, m.CoalesceKey)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	latest := make(map[string]uint64, len(keys))
	iter := s.q(ctx, `SELECT key, seq FROM coalesce_latest WHERE conv_id = ? AND key IN ?`, i64(conv), keys).Iter()
	var (
		key string
		seq int64
	)
	for iter.Scan(&key, &seq) {
		latest[key] = u64(seq)
	}
	if err := iter.Close(); err != nil {
		return err
	}
	// A later message of the key on the page supersedes too, even if its
	// raise of coalesce_latest is still to come (or was lost to a crash
	// before the sweeper ran).
	for _, m := range msgs {
		if m.CoalesceKey != "" {
			latest[m.CoalesceKey] = max(latest[m.CoalesceKey], m.Seq)
		}
	}
	for i := range msgs {
		m := &msgs[i]
		if m.CoalesceKey != "" && latest[m.CoalesceKey] > m.Seq {
			m.Superseded, m.Body = true, ""
		}
	}
	return nil
}

// Latest returns the highest ≤ n messages with floor ≤ seq < before (before
// 0: no upper bound), in ascending order.
func (s *Store) Latest(ctx context.Context, convID uint64, before, floor uint64, n int) ([]store.Message, error) {
	const op = "latest"
	msgs, err := s.latest(ctx, convID, before, floor, n)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return msgs, nil
}

func (s *Store) latest(ctx context.Context, conv, before, floor uint64, n int) ([]store.Message, error) {
	st, err := s.existing(ctx, conv)
	if err != nil {
		return nil, err
	}
	defer s.release(st)
	if n <= 0 || before == 1 {
		return nil, nil
	}
	top, err := s.top(ctx, st)
	if err != nil {
		return nil, err
	}
	hi := top
	if before != 0 {
		hi = min(hi, before-1)
	}
	// Seqs are dense: the n highest are exactly hi-n+1..hi.
	lo := max(floor, 1)
	if hi >= uint64(n) {
		lo = max(lo, hi-uint64(n)+1)
	}
	if lo > hi {
		return nil, nil
	}
	ss, err := s.slots(ctx, conv, lo, hi, n)
	if err != nil || len(ss) == 0 {
		return nil, err
	}
	return s.read(ctx, conv, ss)
}

// recordEdit records target as rewritten by the event at seq: an edit's
// result goes to message_edits; a recall deletes the target's records.
// Both are best effort (see stored).
func (s *Store) recordEdit(ctx context.Context, conv, seq uint64, target store.Message) {
	if target.Recalled {
		err := s.q(ctx, `DELETE FROM message_edits WHERE conv_id = ? AND target_seq = ?`, i64(conv), i64(target.Seq)).Exec()
		if err != nil {
			s.log.Warn("cassandra: recall: edits of the target left behind", logKeyConv, conv, logKeySeq, target.Seq, logKeyErr, err)
		}
		return
	}
	err := s.q(ctx, `INSERT INTO message_edits (conv_id, target_seq, edit_seq, body, edited) VALUES (?, ?, ?, ?, ?)`,
		i64(conv), i64(target.Seq), i64(seq), target.Body, target.Edited).Exec()
	if err != nil {
		// The event is stored and acknowledged all the same (an error
		// would tell the client nothing was stored); AsOf then answers
		// former members with the version before it.
		s.log.Warn("cassandra: edit: record for former members lost", logKeyConv, conv, logKeySeq, seq, logKeyErr, err)
	}
}

// AsOf puts the edited messages of msgs back to what they were at asOf
// (store.Store): the result of the target's last edit at or below asOf as
// message_edits recorded it, or, with none, the body it was appended with
// (the row's body column, which edits never overwrite). Building from
// what is recorded at or below asOf, rather than undoing what came after,
// means an edit whose record is missing can only make the answer older,
// never show what came after asOf.
func (s *Store) AsOf(ctx context.Context, convID, asOf uint64, msgs []store.Message) error {
	const op = "as of"
	var todo []int
	for i, m := range msgs {
		if m.Edited && !m.Recalled && m.Seq <= asOf && m.ConvID == convID {
			todo = append(todo, i)
		}
	}
	err := s.each(ctx, len(todo), func(ctx context.Context, j int) error {
		m := &msgs[todo[j]]
		var (
			body   string
			edited bool
		)
		err := s.q(ctx, `SELECT body, edited FROM message_edits WHERE conv_id = ? AND target_seq = ? AND edit_seq <= ? LIMIT 1`,
			i64(convID), i64(m.Seq), i64(min(asOf, maxSeq))).Scan(&body, &edited)
		if err == nil {
			m.Body, m.Edited = body, edited
			return nil
		}
		if !errors.Is(err, gocql.ErrNotFound) {
			return err
		}
		// The slot knows the row's bucket (the width may have changed
		// since the message was written).
		ss, err := s.slots(ctx, convID, m.Seq, m.Seq, 1)
		if err != nil {
			return err
		}
		if len(ss) != 1 || ss[0].msgID != m.MsgID {
			return fmt.Errorf("message %d of seq %d: %w", m.MsgID, m.Seq, errCorrupt)
		}
		err = s.q(ctx, `SELECT body FROM messages WHERE conv_id = ? AND bucket = ? AND message_id = ?`,
			i64(convID), ss[0].bucket, i64(m.MsgID)).Scan(&body)
		if err != nil {
			return fmt.Errorf("message %d: %w", m.Seq, err)
		}
		m.Body, m.Edited = body, false
		return nil
	})
	if err != nil {
		return fmt.Errorf("cassandra: %s %d: %w", op, convID, err)
	}
	return nil
}
