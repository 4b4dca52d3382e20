package client

import (
	"encoding/json"
	"testing"

	"github.com/parley-im/parley/protocol"
)

// FuzzParseSystemEvent: any body decodes or fails without panicking, and
// a decoded event encodes back to the same event.
func FuzzParseSystemEvent(f *testing.F) {
	f.Add(`{"event":"member_added","actor":"alice","users":["bob","carol"]}`)
	f.Add(`{"event":"role_changed","actor":"alice","users":["bob"],"role":"owner"}`)
	f.Add(`{"event":"device_added","actor":"bob","users":["bob"],"device":"phone"}`)
	f.Add(`{"event":1}`)
	f.Add(`not json`)
	f.Fuzz(func(t *testing.T, body string) {
		m := &protocol.Message{Kind: protocol.KindSystem, Body: body}
		ev, err := ParseSystemEvent(m)
		if err != nil {
			return
		}
		data, err := json.Marshal(ev)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", ev, err)
		}
		again, err := ParseSystemEvent(&protocol.Message{Kind: protocol.KindSystem, Body: string(data)})
		if err != nil || again.Event != ev.Event || again.Actor != ev.Actor || again.Role != ev.Role || again.Device != ev.Device || len(again.Users) != len(ev.Users) {
			t.Fatalf("round trip %+v -> %+v, %v", ev, again, err)
		}
	})
}

func TestParseSystemEventRefusesOtherKinds(t *testing.T) {
	if _, err := ParseSystemEvent(&protocol.Message{Kind: protocol.KindText, Body: `{"event":"member_added"}`}); err == nil {
		t.Fatal("a text message parsed as a system event")
	}
	if _, err := ParseSystemEvent(&protocol.Message{Kind: protocol.KindSystem, Body: `{`}); err == nil {
		t.Fatal("a malformed body parsed")
	}
}
