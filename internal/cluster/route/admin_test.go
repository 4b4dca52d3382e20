package route

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// TestDecodeAdmin: the admin envelope admits each op's own frames only, a
// send never carries an actor, an authority op never a user, and the frame
// is validated as the API validated it.
func TestDecodeAdmin(t *testing.T) {
	lim := protocol.DefaultLimits
	ok := map[string]string{
		`{"op":"members","actor":"admin","f":{"type":"add_members","conv_id":"7","members":["bob"]}}`:                  protocol.TypeAddMembers,
		`{"op":"members","actor":"admin","f":{"type":"mute","conv_id":"7","user_id":"bob","muted":true}}`:              protocol.TypeMute,
		`{"op":"moderate","actor":"admin","f":{"type":"recall","conv_id":"7","target_seq":3,"client_msg_id":"r"}}`:     protocol.TypeRecall,
		`{"op":"send","user":"alice","device":"bot","f":{"type":"send","conv_id":"7","client_msg_id":"c","body":"b"}}`: protocol.TypeSend,
		`{"op":"notice","actor":"admin","conv":7,"cmid":"n1","text":"hello"}`:                                          "",
	}
	// A direct routes by the pair (the same key for both orders).
	for _, env := range []string{
		`{"op":"direct","user":"alice","f":{"type":"open_direct","peer":"bob"}}`,
		`{"op":"direct","user":"bob","f":{"type":"open_direct","peer":"alice"}}`,
	} {
		_, f, key, perr := decodeAdmin([]byte(env), lim)
		if perr != nil || f == nil || f.Type != protocol.TypeOpenDirect || key != store.DirectKey("alice", "bob", false) {
			t.Fatalf("%s: %+v, key %d, %v", env, f, key, perr)
		}
	}
	if _, _, key, perr := decodeAdmin([]byte(`{"op":"direct","user":"alice","f":{"type":"open_direct","peer":"bob","e2e":true}}`), lim); perr != nil || key != store.DirectKey("bob", "alice", true) || key == store.DirectKey("alice", "bob", false) {
		t.Fatalf("e2e direct: key %d, %v", key, perr)
	}
	for env, typ := range ok {
		req, f, conv, perr := decodeAdmin([]byte(env), lim)
		if perr != nil || conv != 7 {
			t.Fatalf("%s: %v (conv %d)", env, perr, conv)
		}
		if (f == nil) != (typ == "") || f != nil && f.Type != typ {
			t.Fatalf("%s: frame %+v", env, f)
		}
		if req.Op == adminOpSend && f.Kind != protocol.KindText {
			t.Fatalf("%s: the send's default kind was not filled (not validated?)", env)
		}
	}
	bad := []string{
		`not json`,
		`{"op":"root","actor":"admin"}`,
		`{"op":"members","actor":"admin","f":{"type":"send","conv_id":"7","client_msg_id":"c","body":"b"}}`,
		`{"op":"moderate","actor":"admin","f":{"type":"add_members","conv_id":"7","members":["bob"]}}`,
		`{"op":"send","user":"alice","device":"d","f":{"type":"recall","conv_id":"7","target_seq":3,"client_msg_id":"r"}}`,
		`{"op":"send","user":"alice","device":"d","actor":"admin","f":{"type":"send","conv_id":"7","client_msg_id":"c","body":"b"}}`,
		`{"op":"send","user":"","device":"d","f":{"type":"send","conv_id":"7","client_msg_id":"c","body":"b"}}`,
		`{"op":"members","actor":"admin","user":"alice","f":{"type":"add_members","conv_id":"7","members":["bob"]}}`,
		`{"op":"members","actor":"bad actor","f":{"type":"add_members","conv_id":"7","members":["bob"]}}`,
		`{"op":"members","actor":"admin","f":{"type":"add_members","members":["bob"]}}`,
		`{"op":"members","actor":"admin","conv":7,"f":{"type":"add_members","conv_id":"7","members":["bob"]}}`,
		`{"op":"members","actor":"admin","f":{"type":"add_members","conv_id":"7","members":[]}}`,
		`{"op":"send","user":"alice","device":"d","f":{"type":"send","conv_id":"7","client_msg_id":"c","body":"` + strings.Repeat("b", lim.MaxBodyBytes+1) + `"}}`,
		`{"op":"notice","actor":"admin","conv":7,"cmid":"n1"}`,
		`{"op":"notice","actor":"admin","conv":0,"cmid":"n1","text":"t"}`,
		`{"op":"notice","actor":"admin","conv":7,"text":"t"}`,
		`{"op":"notice","actor":"admin","conv":7,"cmid":"n1","text":"t","f":{"type":"send"}}`,
		`{"op":"direct","actor":"admin","f":{"type":"open_direct","peer":"bob"}}`,
		`{"op":"direct","user":"alice","device":"d","f":{"type":"open_direct","peer":"bob"}}`,
		`{"op":"direct","user":"alice","f":{"type":"open_direct","conv_id":"7","peer":"bob"}}`,
		`{"op":"direct","user":"alice","f":{"type":"send","conv_id":"7","client_msg_id":"c","body":"b"}}`,
		`{"op":"direct","user":"alice","f":{"type":"open_direct"}}`,
		`{"op":"send","user":"alice","device":"d","f":{"type":"open_direct","peer":"bob"}}`,
	}
	for _, env := range bad {
		if _, _, _, perr := decodeAdmin([]byte(env), lim); perr == nil {
			t.Errorf("%.200s: accepted", env)
		}
	}
}

// TestAdminAnswerRoundTrip: an answer keeps the error's code, message and
// retry hint, and a moving refusal is recognised after the trip.
func TestAdminAnswerRoundTrip(t *testing.T) {
	in := adminAnswer{Err: toWire(&protocol.Error{Code: protocol.CodeOverloaded, Msg: "the conversation is moving between chat processes; retry", RetryAfter: 200})}
	data, _ := json.Marshal(in)
	var out adminAnswer
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if p := out.Err.perr(); p.Code != protocol.CodeOverloaded || p.RetryAfter != 200 || !out.moving() {
		t.Fatalf("%s -> %+v", data, p)
	}
	if (adminAnswer{}).Err.perr() != nil {
		t.Fatal("no error must stay no error")
	}
}

// FuzzDecodeAdmin: the admin envelope decoder never panics, and what it
// accepts names a conversation (a direct: the pair's key) and, but for a
// notice, a frame of its op.
func FuzzDecodeAdmin(f *testing.F) {
	f.Add([]byte(`{"op":"members","actor":"admin","f":{"type":"add_members","conv_id":"7","members":["bob"]}}`))
	f.Add([]byte(`{"op":"send","user":"alice","device":"bot","f":{"type":"send","conv_id":"7","client_msg_id":"c","body":"b"}}`))
	f.Add([]byte(`{"op":"notice","actor":"admin","conv":7,"cmid":"n1","text":"hello"}`))
	f.Add([]byte(`{"op":"direct","user":"alice","f":{"type":"open_direct","peer":"bob","e2e":true}}`))
	f.Add([]byte(`{"op":"moderate","actor":"admin","f":{"type":"edit","conv_id":"7","target_seq":1,"client_msg_id":"e","body":"x"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, fr, conv, perr := decodeAdmin(data, protocol.DefaultLimits)
		if perr != nil {
			return
		}
		if conv == 0 {
			t.Fatalf("accepted without a conversation: %s", data)
		}
		if req.Op == adminOpNotice {
			if fr != nil || req.Text == "" {
				t.Fatalf("notice %s", data)
			}
			return
		}
		if req.Op == adminOpDirect {
			if fr == nil || fr.Type != protocol.TypeOpenDirect || fr.ConvID != 0 || req.Actor != "" || conv != store.DirectKey(req.User, fr.Peer, fr.E2E) {
				t.Fatalf("accepted direct %s as %+v (key %d)", data, fr, conv)
			}
			return
		}
		if fr == nil || !adminOps[req.Op][fr.Type] || fr.ConvID != conv {
			t.Fatalf("accepted %s as %+v", data, fr)
		}
		if (req.Op == adminOpSend) != (req.Actor == "") {
			t.Fatalf("actor and op disagree: %s", data)
		}
	})
}
