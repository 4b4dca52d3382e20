package protocol

import (
	"encoding/json"
	"testing"
)

func TestDecodeKTFrames(t *testing.T) {
	for _, good := range []string{
		`{"type":"kt_keys","rid":"1"}`,
		`{"type":"kt_consistency","from":1,"to":1}`,
		`{"type":"kt_consistency","from":3,"to":9}`,
		`{"type":"kt_leaves"}`,
		`{"type":"kt_leaves","from":0,"limit":1000}`,
		`{"type":"kt_leaves","from":18446744073709551615,"limit":1}`,
	} {
		if _, err := DecodeClient([]byte(good), DefaultLimits); err != nil {
			t.Errorf("%s: %v", good, err)
		}
	}
	for bad, code := range map[string]Code{
		`{"type":"kt_consistency","to":5}`:            CodeInvalidArgument,
		`{"type":"kt_consistency","from":5,"to":4}`:   CodeInvalidArgument,
		`{"type":"kt_consistency","from":5}`:          CodeInvalidArgument,
		`{"type":"kt_consistency","from":-1,"to":4}`:  CodeInvalidArgument,
		`{"type":"kt_consistency","from":"1","to":4}`: CodeBadFrame,
		`{"type":"kt_leaves","limit":1001}`:           CodeInvalidArgument,
		`{"type":"kt_leaves","limit":-1}`:             CodeInvalidArgument,
		`{"type":"kt_leaves","from":1.5}`:             CodeInvalidArgument,
		`{"type":"kt_proof"}`:                         CodeUnknownType,
	} {
		_, err := DecodeClient([]byte(bad), DefaultLimits)
		if err == nil || err.Code != code {
			t.Errorf("%s: got %v, want %s", bad, err, code)
		}
	}
}

func TestKTProofEncoding(t *testing.T) {
	// A user without an entry: no index, entry or proof.
	b, _ := json.Marshal(Frame{Type: TypeBundles, UserID: "bob", KT: &KTProof{Checkpoint: "c\n", Label: []byte{1}, VRFProof: []byte{2}}})
	if string(b) != `{"type":"bundles","user_id":"bob","kt":{"checkpoint":"c\n","label":"AQ==","vrf_proof":"Ag=="}}` {
		t.Errorf("got %s", b)
	}
	b, _ = json.Marshal(Frame{Type: TypeKTKeys, KTKeys: &KTKeys{Origin: "o", NoteKey: "k", VRFKey: []byte{3}}})
	if string(b) != `{"type":"kt_keys","kt_keys":{"origin":"o","note_key":"k","vrf_key":"Aw=="}}` {
		t.Errorf("got %s", b)
	}
}
