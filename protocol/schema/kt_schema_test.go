package schema

import (
	"encoding/json"
	"testing"

	"github.com/parley-im/parley/protocol"
)

// The key transparency frames as the server encodes them match frames.json,
// and so do the requests a client sends.
func TestKTFrames(t *testing.T) {
	cp := "example.org/parley\n2\nAAAA\n\n— example.org/parley sig\n"
	h := make([]byte, 32)
	good := []*protocol.Frame{
		{Type: protocol.TypeKTKeys, RID: "1", KTKeys: &protocol.KTKeys{Origin: "example.org/parley", NoteKey: "example.org/parley+1+AQ", VRFKey: h}},
		{Type: protocol.TypeKTProof, RID: "2", KT: &protocol.KTProof{Checkpoint: cp, Proof: [][]byte{h, h}}},
		{Type: protocol.TypeKTProof, RID: "2", KT: &protocol.KTProof{Checkpoint: cp}},
		{Type: protocol.TypeKTLeaves, RID: "3", KT: &protocol.KTProof{Checkpoint: cp, From: 7, Entries: [][]byte{{1}, {2}}}},
		{Type: protocol.TypeBundles, RID: "4", UserID: "bob", KT: &protocol.KTProof{Checkpoint: cp, Label: h, VRFProof: make([]byte, 80)}},
		{Type: protocol.TypeBundles, RID: "4", UserID: "bob", KT: &protocol.KTProof{Checkpoint: cp, Label: h, VRFProof: make([]byte, 80), Index: 1, Entry: []byte{1}, Proof: [][]byte{h}}},
		{Type: protocol.TypeDevices, RID: "5", UserID: "bob", KT: &protocol.KTProof{Checkpoint: cp, Label: h, VRFProof: make([]byte, 80), Entry: []byte{1}}},
	}
	for _, f := range good {
		f.FillLists()
		data, _ := json.Marshal(f)
		if err := ServerFrame(data); err != nil {
			t.Errorf("%s: %v", data, err)
		}
	}
	for _, bad := range []string{
		`{"type":"kt_keys","kt_keys":{"origin":"o","note_key":"k"}}`,
		`{"type":"kt_proof","kt":{"proof":[]}}`,
		`{"type":"kt_leaves","kt":{"checkpoint":"c","entries":["AQ=="],"extra":1}}`,
		`{"type":"kt_leaves"}`,
	} {
		if err := ServerFrame([]byte(bad)); err == nil {
			t.Errorf("%s validated", bad)
		}
	}
	for _, req := range []*protocol.Frame{
		{Type: protocol.TypeKTKeys, RID: "1"},
		{Type: protocol.TypeKTConsistency, RID: "2", From: 3, To: 9},
		{Type: protocol.TypeKTLeaves, RID: "3", From: 0, Limit: 1000},
	} {
		data, _ := json.Marshal(req)
		if err := ClientFrame(data); err != nil {
			t.Errorf("%s: %v", data, err)
		}
	}
}
