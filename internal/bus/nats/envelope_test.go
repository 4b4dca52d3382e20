package nats

import (
	"reflect"
	"testing"

	"github.com/parley-im/parley/internal/bus"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    bus.Delivery
	}{
		{"empty", bus.Delivery{}},
		{"push", bus.Delivery{Users: []string{"alice", "bob"}, Frame: []byte(`{"type":"msg","seq":3}`), ConvID: 1<<40 + 5, Seq: 300}},
		{"receipt", bus.Delivery{Users: []string{"a"}, Frame: []byte(`{}`)}},
		{"state update", bus.Delivery{Users: []string{"a"}, Frame: []byte(`{}`), ConvID: 4, CoalesceKey: "typing:alice"}},
		{"untracked", bus.Delivery{Users: []string{"a"}, Frame: []byte(`{}`), ConvID: 4, Seq: 8, Untracked: true}},
		{"kick", bus.Delivery{Kick: &bus.Kick{User: "u", Device: "d", Session: "n1-7"}}},
		{"empty user name", bus.Delivery{Users: []string{""}, Frame: []byte("x")}},
		{"group by list", bus.Delivery{Frame: []byte(`{}`), ConvID: 7, Seq: 9, Group: &bus.Group{List: "ab12.3"}}},
		{"group with list", bus.Delivery{Frame: []byte(`{}`), ConvID: 7, Seq: 9, Group: &bus.Group{List: "ab12.4", Full: true,
			Members: []bus.Member{{User: "alice", JoinSeq: 1}, {User: "bob", JoinSeq: 1 << 40}}}}},
		{"group untracked", bus.Delivery{Frame: []byte(`{}`), ConvID: 7, Seq: 9, Untracked: true, Group: &bus.Group{List: "ab12.6"}}},
		{"group emptied", bus.Delivery{Frame: []byte(`{}`), ConvID: 7, Seq: 9, Group: &bus.Group{List: "ab12.5", Full: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeDelivery(encodeDelivery(tc.d))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.d) {
				t.Fatalf("got %+v, want %+v", got, tc.d)
			}
		})
	}
}

func TestEnvelopeRejectsCorruption(t *testing.T) {
	good := encodeDelivery(bus.Delivery{Users: []string{"alice"}, Kick: &bus.Kick{User: "u", Device: "d", Session: "s"}})
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"one byte", []byte{1}},
		{"wrong version", append([]byte{9}, good[1:]...)},
		{"truncated kick", good[:len(good)-2]},
		{"huge user count", []byte{1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"string past end", []byte{1, 0, 0, 0, 0, 1, 50, 'a'}},
		{"coalesce key past end", []byte{1, 0, 0, 0, 9, 'k'}},
		// A group's fields in a version 1 envelope would be read as the
		// frame by a node that predates them.
		{"group in version 1", []byte{1, flagGroup, 0, 0, 0, 0, 1, 'l', 0}},
		{"version 2 without group", []byte{2, 0, 0, 0, 0, 0}},
		{"huge member count", []byte{2, flagGroup, 0, 0, 0, 0, 1, 'l', 0xff, 0xff, 0x0f}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d, err := decodeDelivery(tc.b); err == nil {
				t.Fatalf("decoded %+v, want an error", d)
			}
		})
	}
}

func FuzzEnvelope(f *testing.F) {
	f.Add(encodeDelivery(bus.Delivery{Users: []string{"a", "b"}, Frame: []byte(`{"x":1}`), ConvID: 9, Seq: 3, CoalesceKey: "k"}))
	f.Add(encodeDelivery(bus.Delivery{Kick: &bus.Kick{User: "u", Device: "d", Session: "s"}}))
	f.Add([]byte{1, 0})
	f.Add(encodeDelivery(bus.Delivery{Frame: []byte(`{}`), ConvID: 7, Seq: 9, Group: &bus.Group{List: "p.4", Full: true,
		Members: []bus.Member{{User: "alice", JoinSeq: 1}}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeDelivery(b)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode to an envelope that decodes the same.
		again, err := decodeDelivery(encodeDelivery(d))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(again, d) {
			t.Fatalf("round trip changed %+v into %+v", d, again)
		}
	})
}

// TestEnvelopeKnowsEveryField trips when bus.Delivery grows a field the
// envelope does not carry yet: it would be dropped silently between nodes.
func TestEnvelopeKnowsEveryField(t *testing.T) {
	known := []string{"Users", "Frame", "ConvID", "Seq", "CoalesceKey", "Untracked", "Kick", "Group"}
	typ := reflect.TypeOf(bus.Delivery{})
	if typ.NumField() != len(known) {
		t.Fatalf("bus.Delivery has %d fields, the envelope carries %v: extend encodeDelivery", typ.NumField(), known)
	}
	for _, f := range known {
		if _, ok := typ.FieldByName(f); !ok {
			t.Fatalf("bus.Delivery lost field %s: update the envelope", f)
		}
	}
}
