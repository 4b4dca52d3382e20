package token_test

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/parley-im/parley/token"
)

// An auth service shares an HS256 key (at least 32 bytes, hex in the
// server's auth.hs256_key_file) with the Parley nodes and mints a token per
// login; the node verifies it at the WebSocket handshake.
func Example_hs256() {
	key := []byte("0123456789abcdef0123456789abcdef") // use 32 random bytes
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

	tok, err := token.MintHS256(key, token.Claims{
		User: "alice", Device: "phone-1", IssuedAt: now, Expires: now.Add(time.Hour),
	})
	if err != nil {
		panic(err)
	}

	v, err := token.NewVerifier(token.Config{HS256Key: key, Leeway: token.DefaultLeeway})
	if err != nil {
		panic(err)
	}
	id, err := v.Verify(tok, now.Add(time.Minute))
	fmt.Println(id.User, id.Device, id.Expires.Format(time.RFC3339), err)
	_, err = v.Verify(tok, now.Add(2*time.Hour))
	fmt.Println(errors.Is(err, token.ErrExpired))
	// Output:
	// alice phone-1 2030-01-02T04:04:05Z <nil>
	// true
}

// With EdDSA the auth service keeps the private key and the nodes get only
// the public key (auth.ed25519_public_key_file), so a node cannot mint.
func Example_edDSA() {
	seed := make([]byte, ed25519.SeedSize) // use a random seed (or ParseEd25519PrivateKey)
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

	tok, err := token.MintEdDSA(priv, token.Claims{User: "bob", IssuedAt: now, Expires: now.Add(24 * time.Hour)})
	if err != nil {
		panic(err)
	}
	v, err := token.NewVerifier(token.Config{Ed25519PublicKey: pub})
	if err != nil {
		panic(err)
	}
	id, err := v.Verify(tok, now)
	fmt.Println(id.User, err)

	// A verifier that knows only the public key refuses HS256 tokens, even
	// one keyed with that public key (key confusion).
	forged, _ := token.MintHS256(pub, token.Claims{User: "mallory", Expires: now.Add(time.Hour)})
	_, err = v.Verify(forged, now)
	fmt.Println(errors.Is(err, token.ErrInvalid))
	// Output:
	// bob <nil>
	// true
}

// A token bound to a device is refused for a connection that announces
// another device.
func ExampleIdentity_CheckDevice() {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tok, _ := token.MintHS256(key, token.Claims{User: "alice", Device: "phone-1", IssuedAt: now, Expires: now.Add(time.Hour)})
	v, _ := token.NewVerifier(token.Config{HS256Key: key})
	id, _ := v.Verify(tok, now)
	fmt.Println(id.CheckDevice("phone-1") == nil, errors.Is(id.CheckDevice("laptop"), token.ErrInvalid))
	// Output: true true
}
