package token

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"strings"
	"testing"
)

func TestParseEd25519PublicKey(t *testing.T) {
	pub, _ := edKeys(t)
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), true},
		{"hex", []byte(hex.EncodeToString(pub) + "\n"), true},
		{"wrong pem type", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), false},
		{"short hex", []byte(hex.EncodeToString(pub[:31])), false},
		{"junk", []byte("hello"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEd25519PublicKey(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if tt.ok && !ed25519.PublicKey(pub).Equal(got) {
				t.Fatal("parsed key differs")
			}
		})
	}
}

func TestParseHS256Key(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{hex.EncodeToString(hsKey) + "\n", true},
		{hex.EncodeToString(hsKey[:31]), false},
		{"not hex", false},
	}
	for _, tt := range tests {
		if _, err := ParseHS256Key(tt.in); (err == nil) != tt.ok {
			t.Errorf("ParseHS256Key(%q) err = %v, want ok=%v", tt.in, err, tt.ok)
		}
	}
}

func TestParseEd25519PrivateKey(t *testing.T) {
	pub, priv := edKeys(t)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	bad := append(ed25519.PrivateKey(nil), priv...)
	bad[63] ^= 1
	tests := []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"pem pkcs8", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), true},
		{"hex seed", []byte(hex.EncodeToString(priv.Seed()) + "\n"), true},
		{"hex full", []byte(hex.EncodeToString(priv)), true},
		{"hex full, wrong public half", []byte(hex.EncodeToString(bad)), false},
		{"public key pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), false},
		{"short hex", []byte(hex.EncodeToString(priv[:31])), false},
		{"junk", []byte("hello"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEd25519PrivateKey(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if tt.ok && !pub.Equal(got.Public()) {
				t.Fatal("parsed key differs")
			}
		})
	}
}

// FuzzParseKeys: the key parsers never panic, and whatever they accept has
// the right size.
func FuzzParseKeys(f *testing.F) {
	pub, priv := edKeys(f)
	der, _ := x509.MarshalPKIXPublicKey(pub)
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	f.Add([]byte(hex.EncodeToString(priv)))
	f.Add([]byte(hex.EncodeToString(pub)))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if k, err := ParseEd25519PublicKey(b); err == nil && len(k) != ed25519.PublicKeySize {
			t.Fatalf("public key of %d bytes accepted", len(k))
		}
		if k, err := ParseEd25519PrivateKey(b); err == nil && len(k) != ed25519.PrivateKeySize {
			t.Fatalf("private key of %d bytes accepted", len(k))
		}
		if k, err := ParseHS256Key(string(b)); err == nil && len(k) < MinHS256KeyBytes {
			t.Fatalf("hs256 key of %d bytes accepted", len(k))
		}
	})
}

// TestParseSeveralKeys: key files of a rotation hold several keys — hex
// lines (blank lines and # comments skipped) or PEM blocks one after
// another; an empty file or a bad line is refused, naming the line.
func TestParseSeveralKeys(t *testing.T) {
	a, b := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	keys, err := ParseHS256Keys("# rotation\n" + a + "\n\n  " + b + "  \n")
	if err != nil || len(keys) != 2 || hex.EncodeToString(keys[0]) != a || hex.EncodeToString(keys[1]) != b {
		t.Fatalf("two hex keys: %x %v", keys, err)
	}
	for _, bad := range []string{"", "# none\n", a + "\nnot hex\n", a + "\n" + "abcd\n"} {
		if _, err := ParseHS256Keys(bad); err == nil {
			t.Errorf("ParseHS256Keys(%q) accepted", bad)
		}
	}
	if _, err := ParseHS256Keys(a + "\nzz\n"); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a bad second line: %v, want it named", err)
	}
	p1, _, _ := ed25519.GenerateKey(nil)
	p2, _, _ := ed25519.GenerateKey(nil)
	pemOf := func(k ed25519.PublicKey) []byte {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	}
	eds, err := ParseEd25519PublicKeys(append(pemOf(p1), pemOf(p2)...))
	if err != nil || len(eds) != 2 || !eds[0].Equal(p1) || !eds[1].Equal(p2) {
		t.Fatalf("two PEM keys: %v", err)
	}
	eds, err = ParseEd25519PublicKeys([]byte(hex.EncodeToString(p1) + "\n" + hex.EncodeToString(p2) + "\n"))
	if err != nil || len(eds) != 2 || !eds[1].Equal(p2) {
		t.Fatalf("two hex keys: %v", err)
	}
	if _, err := ParseEd25519PublicKeys(append(pemOf(p1), "trailing"...)); err == nil {
		t.Error("text after the PEM blocks accepted")
	}
}
