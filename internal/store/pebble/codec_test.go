package pebble

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// Each FuzzDecode target checks that arbitrary bytes never panic a decoder
// and that whatever decodes is canonical: a current-version value re-encodes
// to the same bytes, and a version 1 value to a version 2 value that decodes
// to the same thing. Seeds include a valid value and truncations of it, and
// a version 1 value.

func seedTruncations(f *testing.F, valid []byte) {
	f.Add(valid)
	for i := range valid {
		f.Add(valid[:i])
	}
	f.Add(append(append([]byte(nil), valid...), 0))
	f.Add([]byte{codecV2})
	f.Add([]byte{3})
	f.Add([]byte{codecV2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
}

var sampleMessage = store.Message{
	ConvID: 7, Seq: 42, MsgID: 1 << 50, Sender: "alice", SenderDevice: "phone", ClientMsgID: "c-1",
	Kind: "state", Body: "hello, 世界", TargetSeq: 3, ServerTime: 1_704_067_200_000, Edited: true,
	Mentions: []string{"bob", "carol"}, MentionAll: true, CoalesceKey: "packet-1",
}

// asV1 turns a version 2 value into the version 1 value it extends: v1
// is the length of the version 1 part.
func asV1(v2 []byte, v1 int) []byte {
	b := append([]byte(nil), v2[:v1]...)
	b[0] = codecV1
	return b
}

// canonical checks the re-encoding of a decoded value b: identical for
// version 2, and for version 1 a version 2 value decoding to the same.
func canonical[T any](t *testing.T, b []byte, v T, encode func(T) []byte, decode func([]byte) (T, error)) {
	t.Helper()
	re := encode(v)
	if b[0] == codecV2 {
		if !bytes.Equal(re, b) {
			t.Fatalf("decode(%x) = %+v re-encodes to %x", b, v, re)
		}
		return
	}
	back, err := decode(re)
	if err != nil || !reflect.DeepEqual(back, v) {
		t.Fatalf("decode(%x) = %+v re-encodes to %x, which decodes to %+v, %v", b, v, re, back, err)
	}
}

func FuzzDecodeMessage(f *testing.F) {
	valid := encodeMessage(sampleMessage)
	seedTruncations(f, valid)
	v1 := sampleMessage
	v1.MentionAll = false
	v1b := encodeMessage(v1)
	f.Add(asV1(v1b, len(v1b)-1-len("bob")-1-len("carol")-1-1-len("packet-1")))
	f.Add(encodeMessage(store.Message{ServerTime: -5, Recalled: true}))
	withFile := sampleMessage
	withFile.Attachment = 1 << 40
	f.Add(encodeMessage(withFile))
	decode := func(b []byte) (store.Message, error) { return decodeMessage(7, b) }
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := decode(b); err == nil {
			canonical(t, b, m, encodeMessage, decode)
		}
	})
}

func FuzzDecodeConv(f *testing.F) {
	c := store.Conversation{ID: 1, Kind: store.Group, Name: "team", CreatedAt: 9, LastSeq: 300, Members: 2000, Tier: 2}
	valid := encodeConv(c)
	seedTruncations(f, valid)
	f.Add(asV1(valid, len(valid)-1))
	decode := func(b []byte) (store.Conversation, error) { return decodeConv(1, b) }
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := decode(b); err == nil {
			canonical(t, b, c, encodeConv, decode)
		}
	})
}

func FuzzDecodeMember(f *testing.F) {
	valid := encodeMember(store.Member{Role: store.RoleAdmin, JoinSeq: 1000, LeaveSeq: 2000, Muted: true})
	seedTruncations(f, valid)
	f.Add(asV1(valid, len(valid)-3))
	decode := func(b []byte) (store.Member, error) { return decodeMember(1, "u", b) }
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := decode(b); err == nil {
			canonical(t, b, m, encodeMember, decode)
		}
	})
}

func FuzzDecodeConvRow(f *testing.F) {
	valid := encodeConvRow(store.ConvRow{Kind: store.Direct, JoinSeq: 1, LastSeq: 1 << 40, LeaveSeq: 5, MentionSeq: 7})
	seedTruncations(f, valid)
	f.Add(asV1(valid, len(valid)-2))
	decode := func(b []byte) (store.ConvRow, error) { return decodeConvRow("u", 1, b) }
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decode(b); err == nil {
			canonical(t, b, r, encodeConvRow, decode)
		}
	})
}

func FuzzDecodeSeqRef(f *testing.F) {
	seedTruncations(f, encodeSeqRef(seqRef{bucket: 7, msgID: 1 << 60}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeSeqRef(b)
		if err != nil {
			return
		}
		if re := encodeSeqRef(r); !bytes.Equal(re, b) {
			t.Fatalf("decode(%x) = %+v re-encodes to %x", b, r, re)
		}
	})
}

func FuzzDecodeUint(f *testing.F) {
	seedTruncations(f, encodeUint(1<<63))
	f.Add([]byte{0x80, 0x00}) // non-minimal zero
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeUint(b)
		if err != nil {
			return
		}
		if re := encodeUint(v); !bytes.Equal(re, b) {
			t.Fatalf("decode(%x) = %d re-encodes to %x", b, v, re)
		}
	})
}

// FuzzMessageRoundTrip: every message survives encoding, but Superseded,
// which is never stored.
func FuzzMessageRoundTrip(f *testing.F) {
	m := sampleMessage
	f.Add(m.Seq, m.MsgID, m.TargetSeq, m.ServerTime, m.Edited, m.Recalled, m.Sender, m.SenderDevice, m.ClientMsgID,
		m.Kind, m.Body, "bob\x00carol", m.MentionAll, m.CoalesceKey, false, uint64(0), uint64(0), "👍\x00❤️")
	f.Add(uint64(0), ^uint64(0), uint64(1), int64(-1), false, true, "", "", "", "", "", "", false, "", true, ^uint64(0), uint64(3), "")
	f.Add(uint64(4), uint64(5), uint64(0), int64(1), false, false, "a", "", "", "text", "x", "", false, "", false, uint64(0), ^uint64(0), "x")
	f.Fuzz(func(t *testing.T, seq, id, target uint64, at int64, edited, recalled bool, sender, dev, cmid, kind, body,
		mentions string, mentionAll bool, key string, superseded bool, attachment, replyTo uint64, reactions string) {
		in := store.Message{ConvID: 9, Seq: seq, MsgID: id, TargetSeq: target, ServerTime: at, Edited: edited,
			Recalled: recalled, Sender: sender, SenderDevice: dev, ClientMsgID: cmid, Kind: kind, Body: body,
			MentionAll: mentionAll, CoalesceKey: key, Superseded: superseded, Attachment: attachment, ReplyTo: replyTo}
		if mentions != "" {
			in.Mentions = strings.Split(mentions, "\x00")
		}
		if reactions != "" {
			for i, e := range strings.Split(reactions, "\x00") {
				if e != "" {
					in.Reactions = append(in.Reactions, store.Reaction{Emoji: e, Count: i + 1})
				}
			}
		}
		out, err := decodeMessage(9, encodeMessage(in))
		in.Superseded = false
		if err != nil || !reflect.DeepEqual(out, in) {
			t.Fatalf("round trip of %+v = %+v, %v", in, out, err)
		}
	})
}

// TestDecodeV1 reads version 1 values as written before group chat.
func TestDecodeV1(t *testing.T) {
	// Hand-built: version, fields of version 1 only.
	msg := []byte{codecV1, 5, 9, 0, 2, flagEdited, 1, 'a', 0, 0, 4, 't', 'e', 'x', 't', 2, 'h', 'i'}
	wantMsg := store.Message{ConvID: 1, Seq: 5, MsgID: 9, ServerTime: 1, Edited: true, Sender: "a", Kind: "text", Body: "hi"}
	if m, err := decodeMessage(1, msg); err != nil || !reflect.DeepEqual(m, wantMsg) {
		t.Errorf("decodeMessage(v1) = %+v, %v; want %+v", m, err, wantMsg)
	}
	msg[5] = flagMentionAll
	if m, err := decodeMessage(1, msg); err == nil {
		t.Errorf("decodeMessage(v1 with a v2 flag) = %+v, want an error", m)
	}
	conv := []byte{codecV1, byte(store.Group), 2, 7, 3, 1, 'g'}
	wantConv := store.Conversation{ID: 1, Kind: store.Group, CreatedAt: 1, LastSeq: 7, Members: 3, Name: "g"}
	if c, err := decodeConv(1, conv); err != nil || c != wantConv {
		t.Errorf("decodeConv(v1) = %+v, %v; want %+v", c, err, wantConv)
	}
	wantMember := store.Member{ConvID: 1, UserID: "u", Role: store.RoleAdmin, JoinSeq: 4}
	if m, err := decodeMember(1, "u", []byte{codecV1, byte(store.RoleAdmin), 4}); err != nil || m != wantMember {
		t.Errorf("decodeMember(v1) = %+v, %v; want %+v", m, err, wantMember)
	}
	wantRow := store.ConvRow{ConvID: 1, UserID: "u", Kind: store.Direct, JoinSeq: 1, LastSeq: 8}
	if r, err := decodeConvRow("u", 1, []byte{codecV1, byte(store.Direct), 1, 8}); err != nil || r != wantRow {
		t.Errorf("decodeConvRow(v1) = %+v, %v; want %+v", r, err, wantRow)
	}
}

// TestDecodeBeforeAttachments reads a version 2 message as written before
// messages named attachments (the bytes encodeMessage(sampleMessage)
// gave then): it reads with Attachment 0, and a message with an
// attachment reads it back.
func TestDecodeBeforeAttachments(t *testing.T) {
	old, err := hex.DecodeString("022a80808080808080020380d08fa598630505616c6963650570686f6e6503632d310573746174650d68656c6c6f2c20e4b896e7958c0203626f62056361726f6c087061636b65742d31")
	if err != nil {
		t.Fatal(err)
	}
	want := sampleMessage
	if m, err := decodeMessage(7, old); err != nil || !reflect.DeepEqual(m, want) {
		t.Fatalf("decodeMessage(before attachments) = %+v, %v; want %+v", m, err, want)
	}
	if re := encodeMessage(want); !bytes.Equal(re, old) {
		t.Errorf("a message without attachment encodes to %x, want the bytes written before attachments %x", re, old)
	}
	want.Attachment = 77
	b := encodeMessage(want)
	if m, err := decodeMessage(7, b); err != nil || !reflect.DeepEqual(m, want) {
		t.Errorf("decodeMessage(with attachment) = %+v, %v; want %+v", m, err, want)
	}
	if m, err := decodeMessage(7, append(b[:len(b)-1:len(b)-1], 0)); err == nil {
		t.Errorf("decodeMessage(attachment 0 written) = %+v, want an error", m)
	}
	if m, err := decodeMessage(7, b[:len(b)-1]); err == nil {
		t.Errorf("decodeMessage(flag without attachment) = %+v, want an error", m)
	}
}

func TestCorruptValuesFail(t *testing.T) {
	valid := encodeMessage(sampleMessage)
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"unknown version", append([]byte{9}, valid[1:]...)},
		{"truncated", valid[:len(valid)-1]},
		{"trailing byte", append(append([]byte(nil), valid...), 1)},
		{"string longer than value", []byte{codecV2, 1, 1, 0, 0, 0, 0x7f}},
		{"unknown flag", []byte{codecV2, 1, 1, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0}},
		{"more mentions than bytes", []byte{codecV2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 0}},
	}
	for _, tc := range tests {
		if m, err := decodeMessage(1, tc.b); err == nil {
			t.Errorf("%s: decodeMessage(%x) = %+v, want an error", tc.name, tc.b, m)
		}
	}
	if c, err := decodeConv(1, []byte{codecV2, 3, 0, 0, 0, 0, 0}); err == nil {
		t.Errorf("decodeConv with kind 3 = %+v, want an error", c)
	}
	if m, err := decodeMember(1, "u", []byte{codecV2, 3, 1, 0, 0}); err == nil {
		t.Errorf("decodeMember with role 3 = %+v, want an error", m)
	}
	if m, err := decodeMember(1, "u", []byte{codecV2, 0, 1, 0, 2}); err == nil {
		t.Errorf("decodeMember with an unknown flag = %+v, want an error", m)
	}
}

func TestKeyOrder(t *testing.T) {
	// Within a bucket the newest message (highest snowflake) sorts first.
	if bytes.Compare(msgKey(1, 5, 200), msgKey(1, 5, 100)) >= 0 {
		t.Error("msgKey: newer message does not sort first within its bucket")
	}
	if bytes.Compare(seqKey(1, 255), seqKey(1, 256)) >= 0 || bytes.Compare(seqKey(1, 1<<40), seqKey(2, 0)) >= 0 {
		t.Error("seqKey: not ordered by (conv, seq)")
	}
	// A user id that is a prefix of another must not see its rows.
	if bytes.HasPrefix(userConvKey("alice2", 1), userConvPrefix("alice")) {
		t.Error("userConvPrefix(alice) matches alice2's rows")
	}
	if got, want := coalesceKey(258, "k"), []byte{tagCoalesce, 0, 0, 0, 0, 0, 0, 1, 2, 'k'}; !bytes.Equal(got, want) {
		t.Errorf("coalesceKey(258, k) = %x, want %x", got, want)
	}
	if !bytes.Equal(directKey("bob", "alice"), directKey("alice", "bob")) {
		t.Error("directKey depends on argument order")
	}
	if bytes.Equal(readKey("a", 1, ""), readKey("a", 1, "phone")) {
		t.Error("readKey: per-user and per-device positions collide")
	}
	if c, ok := convOfUserConvKey(userConvKey("alice", 77)); !ok || c != 77 {
		t.Errorf("convOfUserConvKey = %d, %v; want 77", c, ok)
	}
	if u, ok := userOfMemberKey(memberKey(3, "bob")); !ok || u != "bob" {
		t.Errorf("userOfMemberKey = %q, %v; want bob", u, ok)
	}
	if got := prefixEnd([]byte{1, 0xff}); !bytes.Equal(got, []byte{2}) {
		t.Errorf("prefixEnd(01ff) = %x, want 02", got)
	}
	for _, tc := range []struct {
		at   int64
		want uint32
	}{{-1, 0}, {0, 0}, {999, 0}, {1000, 1}, {1 << 62, 1<<32 - 1}} {
		if got := bucketOf(tc.at, 1000); got != tc.want {
			t.Errorf("bucketOf(%d, 1000) = %d, want %d", tc.at, got, tc.want)
		}
	}
}

// TestVarint: the decoder reads what binary.AppendVarint writes, for the
// whole int64 range, and refuses an encoding longer than the minimal one.
func TestVarint(t *testing.T) {
	vals := []int64{0, 1, -1, 63, -64, 64, -65, math.MaxInt64, math.MinInt64, 1704067200000, -1704067200000}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		vals = append(vals, int64(r.Uint64()))
	}
	for _, v := range vals {
		d := decoder{b: binary.AppendVarint(nil, v)}
		if got := d.varint(); got != v || d.err != nil || len(d.b) != 0 {
			t.Fatalf("varint of %d read back as %d (%v, %d bytes left)", v, got, d.err, len(d.b))
		}
	}
	for _, b := range [][]byte{{0x80, 0x00}, {0x81, 0x00}} { // 0 and -1 in two bytes
		d := decoder{b: b}
		if d.varint(); d.err == nil {
			t.Errorf("non-minimal varint %x accepted", b)
		}
	}
}

var sampleAttachment = store.Attachment{
	ID: 5, Owner: "alice", Device: "phone", ConvID: 1 << 44, Size: 100 << 20, SHA256: [32]byte{1, 2, 3, 31: 0xff},
	MediaType: "image/png", Name: "cat 🐈.png", State: store.AttachComplete, CreatedAt: 1_704_067_200_000,
	ExpiresAt: 1_704_153_600_000, BlobUpload: "upload-xyz", PartSize: 8 << 20, Received: 13,
	HashState: []byte("sha\x03state"), Width: 4000, Height: 3000, Thumb: store.ThumbPending,
	RefClientMsgID: "c-9", RefSeq: 1 << 33,
}

func FuzzDecodeAttachment(f *testing.F) {
	seedTruncations(f, encodeAttachment(sampleAttachment))
	f.Add(encodeAttachment(store.Attachment{State: store.AttachUploading}))
	decode := func(b []byte) (store.Attachment, error) { return decodeAttachment(5, b) }
	f.Fuzz(func(t *testing.T, b []byte) {
		if a, err := decode(b); err == nil {
			canonical(t, b, a, encodeAttachment, decode)
		}
	})
}

func FuzzDecodeUsage(f *testing.F) {
	seedTruncations(f, encodeUsage(store.Usage{Bytes: 2 << 30, Inflight: 8}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if u, err := decodeUsage(b); err == nil {
			canonical(t, b, u, encodeUsage, decodeUsage)
		}
	})
}

func TestAttachmentCodec(t *testing.T) {
	if a, err := decodeAttachment(5, encodeAttachment(sampleAttachment)); err != nil || !reflect.DeepEqual(a, sampleAttachment) {
		t.Fatalf("round trip = %+v, %v; want %+v", a, err, sampleAttachment)
	}
	for _, bad := range []store.Attachment{{State: 0}, {State: store.AttachDeleting + 1}, {State: store.AttachComplete, Thumb: store.ThumbRefused + 1}} {
		if a, err := decodeAttachment(5, encodeAttachment(bad)); err == nil {
			t.Errorf("decodeAttachment(state %d thumb %d) = %+v, want an error", bad.State, bad.Thumb, a)
		}
	}
	v1 := encodeAttachment(sampleAttachment)
	v1[0] = codecV1
	if a, err := decodeAttachment(5, v1); err == nil {
		t.Errorf("decodeAttachment(version 1) = %+v, want an error", a)
	}
}
