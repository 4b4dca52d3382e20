package route

import (
	"encoding/json"
	"testing"

	"github.com/parley-im/parley/protocol"
)

func TestDecodeBatch(t *testing.T) {
	send := func(conv uint64, cmid string) json.RawMessage {
		raw, _ := json.Marshal(protocol.Frame{Type: protocol.TypeSend, RID: cmid, ConvID: conv, ClientMsgID: cmid, Body: "x"})
		return raw
	}
	ping, _ := json.Marshal(protocol.Frame{Type: protocol.TypePing})
	for _, tc := range []struct {
		name string
		raws []json.RawMessage
		ok   bool
	}{
		{"sends to one conversation", []json.RawMessage{send(7, "a"), send(7, "b"), send(7, "c")}, true},
		{"two conversations", []json.RawMessage{send(7, "a"), send(8, "b")}, false},
		{"not a send", []json.RawMessage{send(7, "a"), ping}, false},
		{"no conversation", []json.RawMessage{send(0, "a"), send(0, "b")}, false},
		{"undecodable", []json.RawMessage{send(7, "a"), json.RawMessage(`{"type":`)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, perr := decodeBatch(tc.raws)
			switch {
			case tc.ok && perr != nil:
				t.Fatalf("decodeBatch: %v, want the frames", perr)
			case !tc.ok && perr == nil:
				t.Fatalf("decodeBatch = %d frames, want bad_frame", len(fs))
			case !tc.ok && perr.Code != protocol.CodeBadFrame:
				t.Fatalf("decodeBatch: code %s, want %s", perr.Code, protocol.CodeBadFrame)
			case tc.ok:
				for i, f := range fs {
					if f.ClientMsgID != string(rune('a'+i)) {
						t.Errorf("frame %d: client_msg_id %q, want the order sent", i, f.ClientMsgID)
					}
				}
			}
		})
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add([]byte(`[{"type":"send","conv_id":"7","client_msg_id":"a","body":"x"},{"type":"send","conv_id":"7","client_msg_id":"b","body":"y"}]`))
	f.Add([]byte(`[{"type":"send","conv_id":"7"},{"type":"ping"}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var raws []json.RawMessage
		if json.Unmarshal(data, &raws) != nil || len(raws) == 0 {
			return
		}
		fs, perr := decodeBatch(raws)
		if perr != nil {
			return
		}
		for _, f := range fs {
			if f.Type != protocol.TypeSend || f.ConvID == 0 || f.ConvID != fs[0].ConvID {
				t.Fatalf("decodeBatch accepted %+v in a batch to %d", f, fs[0].ConvID)
			}
		}
	})
}
