package schema

import (
	"encoding/json"
	"testing"

	"github.com/parley-im/parley/protocol"
)

// The E2E frames as the server encodes them match frames.json.
func TestE2EServerFrames(t *testing.T) {
	key := append([]byte{5}, make([]byte, 32)...)
	pk := &protocol.PreKey{ID: 1, Key: key, Sig: make([]byte, 64)}
	good := []*protocol.Frame{
		{Type: protocol.TypeKeys, RID: "1", KeyCounts: &protocol.KeyCounts{PreKeys: 3}},
		{Type: protocol.TypeBundles, RID: "2", UserID: "bob"},
		{Type: protocol.TypeBundles, RID: "2", UserID: "bob", Bundles: []protocol.KeyBundle{{UserID: "bob", DeviceID: "p", RegistrationID: 9,
			IdentityKey: key, SignedPreKey: *pk, PreKey: &protocol.PreKey{ID: 2, Key: key}, KEMPreKey: pk, KEMLastResort: true}}},
		{Type: protocol.TypeDevices, RID: "3", UserID: "bob", Devices: []protocol.DeviceKeyInfo{{DeviceID: "p", RegistrationID: 1, IdentityKey: key, UpdatedAt: 5}}},
		{Type: protocol.TypeKeysLow, UserID: "bob", DeviceID: "p", KeyCounts: &protocol.KeyCounts{PreKeys: 1, KEMPreKeys: 0}},
		{Type: protocol.TypeConv, Conv: &protocol.ConvInfo{ConvID: 1, Kind: "direct", E2E: true}},
		{Type: protocol.TypeConvList, List: []protocol.ConvSummary{{ConvID: 1, Kind: "group", E2E: true}}},
		{Type: protocol.TypeError, Code: protocol.CodeE2ERequired, Error: "x"},
		{Type: protocol.TypeError, Code: protocol.CodeE2EUnsupported, Error: "x"},
		{Type: protocol.TypeError, Code: protocol.CodeBadKey, Error: "x"},
	}
	for _, f := range good {
		f.FillLists()
		data, _ := json.Marshal(f)
		if err := ServerFrame(data); err != nil {
			t.Errorf("%s: %v", data, err)
		}
	}
	if err := ServerFrame([]byte(`{"type":"keys","counts":{"prekeys":1,"kem_prekeys":1},"extra_field":1}`)); err == nil {
		t.Error("undocumented field validated")
	}
}
