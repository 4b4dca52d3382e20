package bench

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

func pushFrames() [][]byte {
	var out [][]byte
	for _, f := range []protocol.Frame{
		{Type: protocol.TypeMsg, Message: &protocol.Message{ConvID: 1 << 60, Seq: 42, MsgID: 99, Sender: "u\"1", Kind: protocol.KindText,
			Body: stampBody(time.Unix(1_700_000_000, 5), 100), ServerTime: 1_700_000_000_000, Mentions: []string{"a", "b"}, MentionAll: true}},
		{Type: protocol.TypeMsg, Message: &protocol.Message{ConvID: 3, Seq: 1, Kind: protocol.KindSystem, Body: `{"event":"join","x":[1,2.5e3,null,true]}`, ServerTime: -5}},
		{Type: protocol.TypeMsg, Message: &protocol.Message{ConvID: 3, Seq: 7, Kind: protocol.KindText, Body: "\\u00e9\u00e9 short"}},
		{Type: protocol.TypeMsg, Ack: protocol.AckNone, Message: &protocol.Message{ConvID: 4, Seq: 2, Kind: protocol.KindText, Body: "x"}},
		{Type: protocol.TypeMsg, Ack: protocol.AckBatch, Message: &protocol.Message{ConvID: 4, Seq: 3, Kind: protocol.KindText, Body: "y"}},
		{Type: protocol.TypePong},
		{Type: protocol.TypeReceipt, ConvID: 5, Seq: 6},
	} {
		b, err := json.Marshal(f)
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	return out
}

// The server's own frames are always read, with encoding/json's values.
func TestParsePushReadsServerFrames(t *testing.T) {
	for _, data := range pushFrames() {
		p, isMsg, ok := parsePush(data)
		if !ok {
			t.Fatalf("parsePush(%s) refused it", data)
		}
		checkPushAgainstJSON(t, data, p, isMsg)
	}
	for _, bad := range []string{``, `{`, `{"type":"msg"}`, `{"type":"msg","message":null}`, `{"type":"msg","TYPE":"x","message":{"conv_id":"1","seq":1}}`,
		`{"type":"msg","message":{"conv_id":1,"seq":1}}`, `{"type":"msg","message":{"conv_id":"01","seq":1}}`, `{"type":"msg","message":{"conv_id":"1","seq":1,"seq":2}}`,
		`{"type":"msg","message":{"conv_id":"1","seq":1.0}}`, `{"type":"msg","message":{"conv_id":"1","seq":1}} x`} {
		if _, _, ok := parsePush([]byte(bad)); ok {
			t.Errorf("parsePush(%s) accepted it", bad)
		}
	}
}

func checkPushAgainstJSON(t *testing.T, data []byte, p pushInfo, isMsg bool) {
	t.Helper()
	if !isMsg {
		// Only the type is read: the rest must be JSON, not a valid frame.
		var f struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(data, &f); err != nil || f.Type == protocol.TypeMsg {
			t.Fatalf("parsePush read %q as not a msg; encoding/json: type %q, %v", data, f.Type, err)
		}
		return
	}
	// The fields parsePush reads, typed as in protocol.Frame.
	var f struct {
		Type    string `json:"type"`
		Ack     string `json:"ack"`
		Message *struct {
			ConvID     uint64 `json:"conv_id,string"`
			Seq        uint64 `json:"seq"`
			Kind       string `json:"kind"`
			ServerTime int64  `json:"server_time"`
			Body       string `json:"body"`
		} `json:"message"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("parsePush accepted %q, encoding/json: %v", data, err)
	}
	if f.Type != protocol.TypeMsg {
		t.Fatalf("%q: read as a msg, encoding/json says type %q", data, f.Type)
	}
	if f.Message == nil {
		t.Fatalf("%q: accepted a msg without message", data)
	}
	if p.Ack != f.Ack {
		t.Fatalf("%q: ack %q, encoding/json %q", data, p.Ack, f.Ack)
	}
	m := f.Message
	if p.Conv != m.ConvID || p.Seq != m.Seq || p.Text != (m.Kind == protocol.KindText) || p.ServerTime != m.ServerTime {
		t.Fatalf("%q: parsed %+v, encoding/json %+v", data, p, m)
	}
	want, wantOK := parseStamp(m.Body)
	got, gotOK := parseStampBytes(p.Stamp)
	if wantOK != gotOK || !want.Equal(got) {
		t.Fatalf("%q: stamp %v %v, encoding/json's body gives %v %v", data, got, gotOK, want, wantOK)
	}
}

// Whatever parsePush accepts, encoding/json decodes to the same values.
func FuzzParsePushMatchesJSON(f *testing.F) {
	for _, b := range pushFrames() {
		f.Add(b)
	}
	f.Add([]byte(`{"type":"msg","message":{"conv_id":"1","seq":1,"Seq":2}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, isMsg, ok := parsePush(data)
		if !ok {
			return
		}
		checkPushAgainstJSON(t, data, p, isMsg)
	})
}
