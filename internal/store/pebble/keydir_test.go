package pebble

import (
	"bytes"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func FuzzDecodeKeyDirectory(f *testing.F) {
	row := deviceRow{DeviceKeys: store.DeviceKeys{RegistrationID: 7, IdentityKey: []byte("id"),
		SignedPreKey: store.PreKey{ID: 1, Key: []byte("k"), Sig: []byte("s")}, UpdatedAt: 9}, preKeys: 3, kemKeys: 2}
	f.Add(encodeDeviceRow(row))
	row.AccountKey, row.DeviceSig = []byte("account"), []byte("cert")
	f.Add(encodeDeviceRow(row))
	f.Add(encodePreKey(store.PreKey{ID: 4, Key: []byte("key"), Sig: []byte("sig")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Corrupt values are errors, never panics; what decodes re-encodes
		// to the same bytes.
		if r, err := decodeDeviceRow("u", "d", b); err == nil {
			if !bytes.Equal(encodeDeviceRow(r), b) {
				t.Fatalf("device row %x re-encodes differently", b)
			}
		}
		if p, err := decodePreKey(1, b); err == nil {
			if !bytes.Equal(encodePreKey(p), b) {
				t.Fatalf("prekey %x re-encodes differently", b)
			}
		}
	})
}
