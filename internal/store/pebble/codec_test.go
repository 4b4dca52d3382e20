package pebble

import (
	"bytes"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// Each FuzzDecode target checks that arbitrary bytes never panic a decoder
// and that whatever decodes is canonical: it re-encodes to the same bytes.
// Seeds include a valid value and truncations of it.

func seedTruncations(f *testing.F, valid []byte) {
	f.Add(valid)
	for i := range valid {
		f.Add(valid[:i])
	}
	f.Add(append(append([]byte(nil), valid...), 0))
	f.Add([]byte{2})
	f.Add([]byte{codecV1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
}

var sampleMessage = store.Message{
	ConvID: 7, Seq: 42, MsgID: 1 << 50, Sender: "alice", SenderDevice: "phone", ClientMsgID: "c-1",
	Kind: "text", Body: "hello, 世界", TargetSeq: 3, ServerTime: 1_704_067_200_000, Edited: true,
}

func FuzzDecodeMessage(f *testing.F) {
	seedTruncations(f, encodeMessage(sampleMessage))
	f.Add(encodeMessage(store.Message{ServerTime: -5, Recalled: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(7, b)
		if err != nil {
			return
		}
		if re := encodeMessage(m); !bytes.Equal(re, b) {
			t.Fatalf("decode(%x) = %+v re-encodes to %x", b, m, re)
		}
	})
}

func FuzzDecodeConv(f *testing.F) {
	seedTruncations(f, encodeConv(store.Conversation{Kind: store.Group, Name: "team", CreatedAt: 9, LastSeq: 300, Members: 2000}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeConv(1, b)
		if err != nil {
			return
		}
		if re := encodeConv(c); !bytes.Equal(re, b) {
			t.Fatalf("decode(%x) = %+v re-encodes to %x", b, c, re)
		}
	})
}

func FuzzDecodeMember(f *testing.F) {
	seedTruncations(f, encodeMember(store.Member{Role: store.RoleAdmin, JoinSeq: 1000}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMember(1, "u", b)
		if err != nil {
			return
		}
		if re := encodeMember(m); !bytes.Equal(re, b) {
			t.Fatalf("decode(%x) = %+v re-encodes to %x", b, m, re)
		}
	})
}

func FuzzDecodeConvRow(f *testing.F) {
	seedTruncations(f, encodeConvRow(store.ConvRow{Kind: store.Direct, JoinSeq: 1, LastSeq: 1 << 40}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeConvRow("u", 1, b)
		if err != nil {
			return
		}
		if re := encodeConvRow(r); !bytes.Equal(re, b) {
			t.Fatalf("decode(%x) = %+v re-encodes to %x", b, r, re)
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

// FuzzMessageRoundTrip: every message survives encoding.
func FuzzMessageRoundTrip(f *testing.F) {
	m := sampleMessage
	f.Add(m.Seq, m.MsgID, m.TargetSeq, m.ServerTime, m.Edited, m.Recalled, m.Sender, m.SenderDevice, m.ClientMsgID, m.Kind, m.Body)
	f.Add(uint64(0), ^uint64(0), uint64(1), int64(-1), false, true, "", "", "", "", "")
	f.Fuzz(func(t *testing.T, seq, id, target uint64, at int64, edited, recalled bool, sender, dev, cmid, kind, body string) {
		in := store.Message{ConvID: 9, Seq: seq, MsgID: id, TargetSeq: target, ServerTime: at, Edited: edited,
			Recalled: recalled, Sender: sender, SenderDevice: dev, ClientMsgID: cmid, Kind: kind, Body: body}
		out, err := decodeMessage(9, encodeMessage(in))
		if err != nil || out != in {
			t.Fatalf("round trip of %+v = %+v, %v", in, out, err)
		}
	})
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
		{"string longer than value", []byte{codecV1, 1, 1, 0, 0, 0, 0x7f}},
		{"unknown flag", []byte{codecV1, 1, 1, 0, 0, 0x80, 0, 0, 0, 0, 0}},
	}
	for _, tc := range tests {
		if m, err := decodeMessage(1, tc.b); err == nil {
			t.Errorf("%s: decodeMessage(%x) = %+v, want an error", tc.name, tc.b, m)
		}
	}
	if c, err := decodeConv(1, []byte{codecV1, 3, 0, 0, 0, 0}); err == nil {
		t.Errorf("decodeConv with kind 3 = %+v, want an error", c)
	}
	if m, err := decodeMember(1, "u", []byte{codecV1, 3, 1}); err == nil {
		t.Errorf("decodeMember with role 3 = %+v, want an error", m)
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
