package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/kt"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// prefillKT gives the key transparency log of a data directory n entries
// of n other users, so proofs have a realistic depth.
func prefillKT(b *testing.B, fs vfs.FS, dataDir string, n int) {
	b.Helper()
	ctx := context.Background()
	st, err := pebble.Open(ctx, pebble.Config{Dir: filepath.Join(dataDir, "store"), FS: fs})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	l, err := kt.Open(ctx, "parley", kt.Deps{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		devs := []store.DeviceKeys{{DeviceID: "d", IdentityKey: append([]byte{5}, bytes.Repeat([]byte{byte(i)}, 32)...),
			AccountKey: append([]byte{5}, bytes.Repeat([]byte{7}, 32)...), DeviceSig: bytes.Repeat([]byte{byte(i)}, 64)}}
		if _, err := l.Ensure(ctx, fmt.Sprintf("other%06d", i), devs, func(context.Context) ([]store.DeviceKeys, error) { return devs, nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// uploadTB publishes a device's keys without one-time prekeys, so every
// bundle of it is alike (the signed prekey and the last-resort KEM key).
func uploadTB(b *testing.B, c *rawConn, user, device string) {
	b.Helper()
	d, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: user, Device: device})
	if err != nil {
		b.Fatal(err)
	}
	up, err := d.GenerateKeys(0)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := d.CreateAccountKey(); err != nil {
		b.Fatal(err)
	}
	ak, sig, err := d.DeviceCertificate()
	if err != nil {
		b.Fatal(err)
	}
	k := protocol.KeyUpload{RegistrationID: up.RegistrationID, IdentityKey: up.IdentityKey.Bytes(), AccountKey: ak.Bytes(), DeviceSig: sig,
		SignedPreKey:  &protocol.PreKey{ID: up.SignedPreKey.ID, Key: up.SignedPreKey.Key.Bytes(), Sig: up.SignedPreKey.Sig},
		LastResortKEM: &protocol.PreKey{ID: up.LastResortKEM.ID, Key: up.LastResortKEM.Key, Sig: up.LastResortKEM.Sig}}
	mustOK(b, c.call(protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &k}), protocol.TypeKeys)
}

// BenchmarkKTBundleFetch measures a keys_bundle round trip over a
// WebSocket (one device, no one-time keys left) and the answer's bytes,
// with key transparency proofs (a log of 10,000 other users' entries
// before the run) and without (kt.enabled off), in the same run.
func BenchmarkKTBundleFetch(b *testing.B) {
	for _, proofs := range []bool{true, false} {
		name := "proofs"
		if !proofs {
			name = "no-proofs"
		}
		b.Run(name, func(b *testing.B) {
			fs, dir := vfs.NewMem(), b.TempDir()
			if proofs {
				prefillKT(b, fs, dir, 10_000)
			}
			srv := servertest.Start(b, servertest.WithDataDir(dir),
				servertest.WithDeps(func(d *server.Deps) { d.StoreFS = fs }),
				servertest.WithConfig(func(c *config.Config) { c.KT.Enabled = proofs }),
				servertest.WithChat(func(c *chat.Config) { c.PrekeysPerRequester, c.PrekeysPerDevice = 1<<30, 1<<30 }))
			uploadTB(b, dialRaw(b, srv, "bob", "phone"), "bob", "phone")
			alice := dialRaw(b, srv, "alice", "a")
			alice.openDirect("bob")
			var size, hashes int
			for b.Loop() {
				f := mustOK(b, alice.call(protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "bob", DeviceID: "phone"}), protocol.TypeBundles)
				if (f.KT != nil) != proofs || len(f.Bundles) != 1 {
					b.Fatalf("answer %+v", f)
				}
				if size == 0 {
					data, _ := json.Marshal(f)
					size = len(data)
					if f.KT != nil {
						hashes = len(f.KT.Proof)
					}
				}
			}
			b.ReportMetric(float64(size), "answer-bytes")
			b.ReportMetric(float64(hashes), "proof-hashes")
		})
	}
}
