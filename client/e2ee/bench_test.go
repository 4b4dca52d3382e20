package e2ee

import (
	"fmt"
	"os"
	"testing"
)

// Session setup: Alice processes a bundle and encrypts, Bob decrypts the
// PreKey message (both halves of X3DH/PQXDH, with MemoryStore).
func BenchmarkSessionSetup(b *testing.B) {
	for _, pq := range []bool{true, false} {
		name := "x3dh"
		if pq {
			name = "pqxdh"
		}
		b.Run(name, func(b *testing.B) {
			bob := newTestDev(b, "bob", "b")
			bob.SetAllowX3DH(!pq)
			bundle := bob.bundle(false, false) // no one-time keys: reusable
			if pq {
				bundle.KEMPreKey = bob.keys.LastResortKEM
			}
			for i := 0; i < b.N; i++ {
				alice := newTestDevLight(b, "alice", fmt.Sprint("a", i))
				alice.SetAllowX3DH(!pq)
				if err := alice.ProcessBundle(bundle); err != nil {
					b.Fatal(err)
				}
				typ, ct, err := alice.Encrypt(bob.Address(), []byte("hello"))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := bob.Decrypt(alice.Address(), typ, ct); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func sessionPair(b *testing.B) (*testDev, *testDev) {
	alice, bob := newTestDev(b, "alice", "a"), newTestDev(b, "bob", "b")
	if err := alice.ProcessBundle(bob.bundle(true, true)); err != nil {
		b.Fatal(err)
	}
	typ, ct, _ := alice.Encrypt(bob.Address(), []byte("x"))
	if _, err := bob.Decrypt(alice.Address(), typ, ct); err != nil {
		b.Fatal(err)
	}
	typ, ct, _ = bob.Encrypt(alice.Address(), []byte("x"))
	if _, err := alice.Decrypt(bob.Address(), typ, ct); err != nil {
		b.Fatal(err)
	}
	return alice, bob
}

var msg100 = make([]byte, 100)

// Encrypt and Decrypt of a 100-byte message on an established session,
// through Device (state loaded and saved per message, JSON in MemoryStore).
func BenchmarkEncrypt(b *testing.B) {
	alice, bob := sessionPair(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := alice.Encrypt(bob.Address(), msg100); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecrypt(b *testing.B) {
	alice, bob := sessionPair(b)
	cts := make([][]byte, b.N)
	for i := range cts {
		_, cts[i], _ = alice.Encrypt(bob.Address(), msg100)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := bob.Decrypt(alice.Address(), TypeSignal, cts[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// The ratchet alone (no store): what the cryptography costs.
func BenchmarkRatchetEncryptDecrypt(b *testing.B) {
	alice, bob := sessionPair(b)
	var ra, rb sessionRecord
	alice.load("session/"+bob.Address().String(), &ra)
	bob.load("session/"+alice.Address().String(), &rb)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, ct := ra.Current.encrypt(msg100)
		m, err := ParseSignalMessage(ct)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := rb.Current.decrypt(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGroupEncrypt(b *testing.B) {
	alice := newTestDevLight(b, "alice", "a")
	if _, err := alice.GroupDistribution("g", FormatModern); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := alice.GroupEncrypt("g", msg100, FormatModern); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGroupDecrypt(b *testing.B) {
	alice, bob := newTestDevLight(b, "alice", "a"), newTestDevLight(b, "bob", "b")
	distribute(b, "g", alice, []*testDev{bob}, FormatModern)
	cts := make([][]byte, b.N)
	for i := range cts {
		cts[i], _ = alice.GroupEncrypt("g", msg100, FormatModern)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := bob.GroupDecrypt("g", alice.Address(), cts[i], FormatModern); err != nil {
			b.Fatal(err)
		}
	}
}

// FileStore.Save of a 2 KB value (a session's size), with the directory
// fsync after the rename and, for comparison, without it.
func BenchmarkFileStoreSave(b *testing.B) {
	for _, dirSync := range []bool{true, false} {
		name := "file+dir-fsync"
		if !dirSync {
			name = "file-fsync-only"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			fs, err := OpenFileStore(dir)
			if err != nil {
				b.Fatal(err)
			}
			defer fs.Close()
			if !dirSync {
				fs.syncFile = func(f *os.File) error {
					if f.Name() == dir {
						return nil
					}
					return f.Sync()
				}
			}
			v := make([]byte, 2048)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := fs.Save("session/bob/phone", v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
