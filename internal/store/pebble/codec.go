package pebble

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/parley-im/parley/internal/store"
)

// Values are a version byte followed by uvarints/varints and length-prefixed
// strings. Decoders validate every byte (lengths, enums, minimal varints,
// trailing bytes), so a corrupt value is an error and never a panic or a huge
// allocation, and a current-version value that decodes re-encodes to the
// same bytes.
//
// Version 2 appends fields to the end of version 1 values (group chat:
// leave, mute, tier, mentions, coalesce keys); later fields of version 2
// values are optional and announced by a flag (a message's attachment), so
// that values written before them read unchanged. Encoders write version 2;
// decoders also read version 1, which decodes with the new fields zero and
// re-encodes as version 2.

const (
	codecV1 = 1
	codecV2 = 2
)

var errCorrupt = errors.New("corrupt value")

// Message flags; v1 values only know the first two.
const (
	flagEdited     = 1 << 0
	flagRecalled   = 1 << 1
	flagMentionAll = 1 << 2
	// flagAttachment: an uvarint attachment id (non-zero) ends the value.
	// Values written before attachments never have it and read as
	// Attachment 0.
	flagAttachment = 1 << 3
	// flagReplyTo: an uvarint seq (non-zero), the message answered,
	// follows the attachment id. Values written before replies never
	// have it and read as ReplyTo 0.
	flagReplyTo = 1 << 4
	// flagReactions: an uvarint count of (emoji, uvarint count) pairs
	// ends the value (after the reply's seq).
	flagReactions = 1 << 5
	flagsKnownV1  = flagEdited | flagRecalled
	flagsKnown    = flagsKnownV1 | flagMentionAll | flagAttachment | flagReplyTo | flagReactions
)

// Member flags (v2).
const (
	memberMuted      = 1 << 0
	memberFlagsKnown = memberMuted
)

type encoder struct{ b []byte }

func (e *encoder) byte(v byte)      { e.b = append(e.b, v) }
func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) string(s string)  { e.uvarint(uint64(len(s))); e.b = append(e.b, s...) }
func newEncoder(size int) *encoder  { return &encoder{b: append(make([]byte, 0, size), codecV2)} }
func (e *encoder) bytes() []byte    { return e.b }

// decoder keeps the first error; every read after it returns zero values.
type decoder struct {
	b       []byte
	err     error
	version byte
}

func newDecoder(b []byte) *decoder {
	d := &decoder{b: b}
	d.version = d.byte()
	if d.err == nil && d.version != codecV1 && d.version != codecV2 {
		d.fail()
	}
	return d
}

// v2 reports whether the value has the version 2 fields.
func (d *decoder) v2() bool { return d.err == nil && d.version >= codecV2 }

func (d *decoder) fail() { d.err = errCorrupt }

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != uvarintLen(v) {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// uvarintLen is the length of v's minimal encoding; decoders reject longer
// ones so that every value has exactly one encoding.
func uvarintLen(v uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return len(binary.AppendUvarint(buf[:0], v))
}

// varint reads a signed varint: binary.AppendVarint's zig-zag form of a
// uvarint, so the uvarint's checks (minimal encoding) hold for it too.
func (d *decoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// finish reports the first error, or an error if bytes are left over.
func (d *decoder) finish(what string) error {
	if d.err == nil && len(d.b) != 0 {
		d.fail()
	}
	if d.err != nil {
		return fmt.Errorf("%s: %w", what, d.err)
	}
	return nil
}

// encodeMessage stores everything but ConvID, which is in the key, and
// Superseded, which reads compute.
func encodeMessage(m store.Message) []byte {
	size := 62 + len(m.Sender) + len(m.SenderDevice) + len(m.ClientMsgID) + len(m.Kind) + len(m.Body) + len(m.CoalesceKey)
	for _, u := range m.Mentions {
		size += 1 + len(u)
	}
	e := newEncoder(size)
	e.uvarint(m.Seq)
	e.uvarint(m.MsgID)
	e.uvarint(m.TargetSeq)
	e.varint(m.ServerTime)
	var flags byte
	if m.Edited {
		flags |= flagEdited
	}
	if m.Recalled {
		flags |= flagRecalled
	}
	if m.MentionAll {
		flags |= flagMentionAll
	}
	if m.Attachment != 0 {
		flags |= flagAttachment
	}
	if m.ReplyTo != 0 {
		flags |= flagReplyTo
	}
	if len(m.Reactions) != 0 {
		flags |= flagReactions
	}
	e.byte(flags)
	e.string(m.Sender)
	e.string(m.SenderDevice)
	e.string(m.ClientMsgID)
	e.string(m.Kind)
	e.string(m.Body)
	e.uvarint(uint64(len(m.Mentions)))
	for _, u := range m.Mentions {
		e.string(u)
	}
	e.string(m.CoalesceKey)
	if m.Attachment != 0 {
		e.uvarint(m.Attachment)
	}
	if m.ReplyTo != 0 {
		e.uvarint(m.ReplyTo)
	}
	if len(m.Reactions) != 0 {
		e.uvarint(uint64(len(m.Reactions)))
		for _, r := range m.Reactions {
			e.string(r.Emoji)
			e.uvarint(uint64(r.Count))
		}
	}
	return e.bytes()
}

func decodeMessage(conv uint64, b []byte) (store.Message, error) {
	d := newDecoder(b)
	m := store.Message{ConvID: conv}
	m.Seq = d.uvarint()
	m.MsgID = d.uvarint()
	m.TargetSeq = d.uvarint()
	m.ServerTime = d.varint()
	flags := d.byte()
	known := byte(flagsKnownV1)
	if d.version >= codecV2 {
		known = flagsKnown
	}
	if d.err == nil && flags&^known != 0 {
		d.fail()
	}
	m.Edited = flags&flagEdited != 0
	m.Recalled = flags&flagRecalled != 0
	m.MentionAll = flags&flagMentionAll != 0
	m.Sender = d.string()
	m.SenderDevice = d.string()
	m.ClientMsgID = d.string()
	m.Kind = d.string()
	m.Body = d.string()
	if d.v2() {
		n := d.uvarint()
		// Each mention takes at least its length byte, which bounds the
		// allocation by the value's size.
		if d.err == nil && n > uint64(len(d.b)) {
			d.fail()
		}
		if d.err == nil && n > 0 {
			m.Mentions = make([]string, n)
			for i := range m.Mentions {
				m.Mentions[i] = d.string()
			}
		}
		m.CoalesceKey = d.string()
		if flags&flagAttachment != 0 {
			m.Attachment = d.uvarint()
			if d.err == nil && m.Attachment == 0 {
				d.fail() // 0 is written as absent
			}
		}
		if flags&flagReplyTo != 0 {
			m.ReplyTo = d.uvarint()
			if d.err == nil && m.ReplyTo == 0 {
				d.fail() // 0 is written as absent
			}
		}
		if flags&flagReactions != 0 {
			m.Reactions = decodeReactions(d)
		}
	}
	if err := d.finish("message"); err != nil {
		return store.Message{}, err
	}
	return m, nil
}

// decodeReactions reads a message's reaction counts: at least one, each
// with a non-empty emoji and a count of at least 1.
func decodeReactions(d *decoder) []store.Reaction {
	n := d.uvarint()
	// Each pair takes at least two bytes, which bounds the allocation.
	if d.err == nil && (n == 0 || n > uint64(len(d.b))) {
		d.fail()
	}
	if d.err != nil {
		return nil
	}
	out := make([]store.Reaction, n)
	for i := range out {
		out[i].Emoji = d.string()
		c := d.uvarint()
		if d.err == nil && (out[i].Emoji == "" || c == 0 || c > math.MaxInt32) {
			d.fail()
		}
		out[i].Count = int(c)
	}
	return out
}

// encodeEmojis is the value of an A row: a user's emojis on a message.
func encodeEmojis(es []string) []byte {
	e := newEncoder(1 + 8*len(es))
	e.uvarint(uint64(len(es)))
	for _, s := range es {
		e.string(s)
	}
	return e.bytes()
}

func decodeEmojis(b []byte) ([]string, error) {
	d := newDecoder(b)
	n := d.uvarint()
	if d.err == nil && (n == 0 || n > uint64(len(d.b))) {
		d.fail()
	}
	var out []string
	if d.err == nil {
		out = make([]string, n)
		for i := range out {
			out[i] = d.string()
		}
	}
	if err := d.finish("reactions"); err != nil {
		return nil, err
	}
	return out, nil
}

// seqRef is the value of an S row: where the message lives. Keeping the
// bucket here (not recomputing it) lets BucketWidth change between opens.
type seqRef struct {
	bucket uint32
	msgID  uint64
}

func encodeSeqRef(r seqRef) []byte {
	b := make([]byte, 0, 12)
	b = binary.BigEndian.AppendUint32(b, r.bucket)
	return binary.BigEndian.AppendUint64(b, r.msgID)
}

func decodeSeqRef(b []byte) (seqRef, error) {
	if len(b) != 12 {
		return seqRef{}, fmt.Errorf("seq ref: %w", errCorrupt)
	}
	return seqRef{bucket: binary.BigEndian.Uint32(b), msgID: binary.BigEndian.Uint64(b[4:])}, nil
}

func validKind(k store.ConvKind) bool { return k == store.Direct || k == store.Group }

func encodeConv(c store.Conversation) []byte {
	e := newEncoder(24 + len(c.Name))
	e.byte(byte(c.Kind))
	e.varint(c.CreatedAt)
	e.uvarint(c.LastSeq)
	e.uvarint(uint64(c.Members))
	e.string(c.Name)
	e.byte(c.Tier)
	// Optional trailing flags byte, written only when non-zero so that
	// values without it re-encode unchanged; with convFlagEveryone an
	// uvarint EveryoneSeq (non-zero) follows.
	var flags byte
	if c.E2E {
		flags |= convFlagE2E
	}
	if c.EveryoneSeq != 0 {
		flags |= convFlagEveryone
	}
	if flags != 0 {
		e.byte(flags)
	}
	if c.EveryoneSeq != 0 {
		e.uvarint(c.EveryoneSeq)
	}
	return e.bytes()
}

// Conversation flags (the optional last byte of a v2 conversation value).
const (
	convFlagE2E      = 1 << 0
	convFlagEveryone = 1 << 1 // EveryoneSeq follows
)

func decodeConv(id uint64, b []byte) (store.Conversation, error) {
	d := newDecoder(b)
	c := store.Conversation{ID: id}
	c.Kind = store.ConvKind(d.byte())
	if d.err == nil && !validKind(c.Kind) {
		d.fail()
	}
	c.CreatedAt = d.varint()
	c.LastSeq = d.uvarint()
	members := d.uvarint()
	if d.err == nil && members > 1<<40 {
		d.fail()
	}
	c.Members = int(members)
	c.Name = d.string()
	if d.v2() {
		c.Tier = d.byte()
		if d.err == nil && len(d.b) > 0 {
			f := d.byte()
			if f == 0 || f&^(convFlagE2E|convFlagEveryone) != 0 {
				d.fail()
			}
			c.E2E = f&convFlagE2E != 0
			if f&convFlagEveryone != 0 {
				c.EveryoneSeq = d.uvarint()
				if d.err == nil && c.EveryoneSeq == 0 {
					d.fail() // 0 is written as absent
				}
			}
		}
	}
	if err := d.finish("conversation"); err != nil {
		return store.Conversation{}, err
	}
	return c, nil
}

func encodeMember(m store.Member) []byte {
	e := newEncoder(23)
	e.byte(byte(m.Role))
	e.uvarint(m.JoinSeq)
	e.uvarint(m.LeaveSeq)
	var flags byte
	if m.Muted {
		flags |= memberMuted
	}
	e.byte(flags)
	return e.bytes()
}

func decodeMember(conv uint64, user string, b []byte) (store.Member, error) {
	d := newDecoder(b)
	m := store.Member{ConvID: conv, UserID: user}
	m.Role = store.Role(d.byte())
	if d.err == nil && m.Role > store.RoleOwner {
		d.fail()
	}
	m.JoinSeq = d.uvarint()
	if d.v2() {
		m.LeaveSeq = d.uvarint()
		flags := d.byte()
		if d.err == nil && flags&^memberFlagsKnown != 0 {
			d.fail()
		}
		m.Muted = flags&memberMuted != 0
	}
	if err := d.finish("member"); err != nil {
		return store.Member{}, err
	}
	return m, nil
}

func encodeConvRow(r store.ConvRow) []byte {
	e := newEncoder(42)
	e.byte(byte(r.Kind))
	e.uvarint(r.JoinSeq)
	e.uvarint(r.LastSeq)
	e.uvarint(r.LeaveSeq)
	e.uvarint(r.MentionSeq)
	return e.bytes()
}

func decodeConvRow(user string, conv uint64, b []byte) (store.ConvRow, error) {
	d := newDecoder(b)
	r := store.ConvRow{ConvID: conv, UserID: user}
	r.Kind = store.ConvKind(d.byte())
	if d.err == nil && !validKind(r.Kind) {
		d.fail()
	}
	r.JoinSeq = d.uvarint()
	r.LastSeq = d.uvarint()
	if d.v2() {
		r.LeaveSeq = d.uvarint()
		r.MentionSeq = d.uvarint()
	}
	if err := d.finish("conversation row"); err != nil {
		return store.ConvRow{}, err
	}
	return r, nil
}

// encodeUint is the value of I and K (seq), D (conv id), R and V
// (positions) rows.
func encodeUint(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func decodeUint(b []byte) (uint64, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) || n != uvarintLen(v) {
		return 0, fmt.Errorf("integer: %w", errCorrupt)
	}
	return v, nil
}
