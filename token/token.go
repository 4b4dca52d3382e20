// Package token mints and verifies Parley's bearer tokens: JWTs signed with
// HS256 (a shared key) or EdDSA (an Ed25519 key pair whose private half stays
// with the issuer). An application's own auth service uses it to issue the
// tokens its users present to a Parley node; the node uses the same Verifier
// at the WebSocket handshake, so what Verify accepts here is exactly what the
// server accepts.
//
// A token carries sub (the user id), an optional dev (the device it is bound
// to), iat, an optional nbf and a required exp. Verification pins each
// configured key to its own algorithm, so alg=none and key confusion (an
// HS256 token "signed" with an Ed25519 public key) fail.
//
// Concurrency: a Verifier is immutable once built and safe for concurrent use.
// The Mint functions and the key parsers keep no state.
package token

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/parley-im/parley/protocol"
)

// Sentinel errors. The gateway maps ErrExpired to protocol.CodeTokenExpired
// (the client should refresh) and ErrInvalid to protocol.CodeUnauthorized.
var (
	ErrExpired = errors.New("token: expired")
	ErrInvalid = errors.New("token: invalid")
)

// DefaultLeeway absorbs clock skew between the issuer and this server.
const DefaultLeeway = 30 * time.Second

// maxLeeway bounds the leeway: beyond a few minutes it stops being skew
// tolerance and starts extending every token's lifetime.
const maxLeeway = 5 * time.Minute

// MinHS256KeyBytes is the shortest accepted HS256 key; RFC 7518 §3.2 asks
// for a key at least as long as the hash output.
const MinHS256KeyBytes = 32

// maxTokenBytes bounds the work an unauthenticated peer can make us do: a
// legitimate token is a few hundred bytes.
const maxTokenBytes = 4096

// Config selects the keys a Verifier accepts. At least one of HS256Key and
// Ed25519PublicKey must be set; with both, a token may use either algorithm.
type Config struct {
	HS256Key         []byte
	Ed25519PublicKey ed25519.PublicKey
	// ExtraHS256Keys and ExtraEd25519PublicKeys are accepted too: during
	// a key rotation, the next key (or the previous one) beside the
	// current, so tokens signed with either verify.
	ExtraHS256Keys         [][]byte
	ExtraEd25519PublicKeys []ed25519.PublicKey
	// Leeway is the tolerated clock skew for exp, nbf and iat (DefaultLeeway
	// in the server's configuration).
	Leeway time.Duration
}

// Validate reports a Config that NewVerifier would reject.
func (c Config) Validate() error {
	if len(c.HS256Key) == 0 && len(c.Ed25519PublicKey) == 0 {
		return errors.New("token: no verification key configured")
	}
	if len(c.HS256Key) > 0 && len(c.HS256Key) < MinHS256KeyBytes {
		return fmt.Errorf("token: hs256 key is %d bytes, need at least %d", len(c.HS256Key), MinHS256KeyBytes)
	}
	if len(c.Ed25519PublicKey) > 0 && len(c.Ed25519PublicKey) != ed25519.PublicKeySize {
		return fmt.Errorf("token: ed25519 public key is %d bytes, want %d", len(c.Ed25519PublicKey), ed25519.PublicKeySize)
	}
	if len(c.ExtraHS256Keys) > 0 && len(c.HS256Key) == 0 || len(c.ExtraEd25519PublicKeys) > 0 && len(c.Ed25519PublicKey) == 0 {
		return errors.New("token: extra keys without a key of their kind")
	}
	for _, k := range c.ExtraHS256Keys {
		if len(k) < MinHS256KeyBytes {
			return fmt.Errorf("token: an extra hs256 key is %d bytes, need at least %d", len(k), MinHS256KeyBytes)
		}
	}
	for _, k := range c.ExtraEd25519PublicKeys {
		if len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("token: an extra ed25519 public key is %d bytes, want %d", len(k), ed25519.PublicKeySize)
		}
	}
	if c.Leeway < 0 || c.Leeway > maxLeeway {
		return fmt.Errorf("token: leeway %v outside [0, %v]", c.Leeway, maxLeeway)
	}
	return nil
}

// Identity is what a verified token proves.
type Identity struct {
	User string
	// Device is the device the token is bound to; empty means any device of
	// User may use it.
	Device  string
	Expires time.Time
	// IssuedAt is the token's iat (second precision); zero when the token
	// has none. The server's revocations refuse tokens issued before a
	// time.
	IssuedAt time.Time
}

// CheckDevice reports whether a connection announcing device may use this
// identity. A token bound to one device must not open sessions for another:
// otherwise a leaked device token would let its holder read as every device.
func (id Identity) CheckDevice(device string) error {
	if id.Device != "" && id.Device != device {
		return fmt.Errorf("check device: token bound to device %q, connection is %q: %w", id.Device, device, ErrInvalid)
	}
	return nil
}

// claims is the token payload: the registered claims plus the device binding.
type claims struct {
	jwt.RegisteredClaims
	Device string `json:"dev,omitempty"`
}

// Verifier checks token signatures and claims.
type Verifier struct {
	hsKeys  jwt.VerificationKeySet // the current key first
	edKeys  jwt.VerificationKeySet
	methods []string
	leeway  time.Duration
}

// NewVerifier builds a Verifier from cfg. The key slices are copied.
func NewVerifier(cfg Config) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &Verifier{leeway: cfg.Leeway}
	if len(cfg.HS256Key) > 0 {
		for _, k := range append([][]byte{cfg.HS256Key}, cfg.ExtraHS256Keys...) {
			v.hsKeys.Keys = append(v.hsKeys.Keys, append([]byte(nil), k...))
		}
		v.methods = append(v.methods, jwt.SigningMethodHS256.Alg())
	}
	if len(cfg.Ed25519PublicKey) > 0 {
		for _, k := range append([]ed25519.PublicKey{cfg.Ed25519PublicKey}, cfg.ExtraEd25519PublicKeys...) {
			v.edKeys.Keys = append(v.edKeys.Keys, append(ed25519.PublicKey(nil), k...))
		}
		v.methods = append(v.methods, jwt.SigningMethodEdDSA.Alg())
	}
	return v, nil
}

// Verify checks token as of now. It returns ErrExpired for a correctly
// signed token whose exp (plus leeway) has passed, and an error wrapping
// ErrInvalid for anything else wrong.
func (v *Verifier) Verify(token string, now time.Time) (Identity, error) {
	if len(token) > maxTokenBytes {
		return Identity{}, fmt.Errorf("verify: token is %d bytes, limit %d: %w", len(token), maxTokenBytes, ErrInvalid)
	}
	p := jwt.NewParser(
		// Pinning the algorithms is what defeats alg=none and key confusion
		// (an HS256 token "signed" with our public key).
		jwt.WithValidMethods(v.methods),
		jwt.WithLeeway(v.leeway),
		jwt.WithTimeFunc(func() time.Time { return now }),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		// Lenient base64 lets several strings carry one signature; strict
		// decoding keeps a token's text unique, so nothing keyed by that
		// text (a cache, a deny list) can be sidestepped by re-encoding.
		jwt.WithStrictDecoding(),
	)
	var c claims
	_, err := p.ParseWithClaims(token, &c, v.key)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Identity{}, fmt.Errorf("verify: %w", ErrExpired)
	case err != nil:
		return Identity{}, fmt.Errorf("verify: %v: %w", err, ErrInvalid)
	}
	if !protocol.ValidID(c.Subject) {
		return Identity{}, fmt.Errorf("verify: sub %q is not a valid user id: %w", c.Subject, ErrInvalid)
	}
	if c.Device != "" && !protocol.ValidID(c.Device) {
		return Identity{}, fmt.Errorf("verify: dev %q is not a valid device id: %w", c.Device, ErrInvalid)
	}
	id := Identity{User: c.Subject, Device: c.Device, Expires: c.ExpiresAt.Time}
	if c.IssuedAt != nil {
		id.IssuedAt = c.IssuedAt.Time
	}
	return id, nil
}

// key hands the parser the key for the token's algorithm. The type switch
// matters as much as WithValidMethods: each key is only ever used with its
// own algorithm.
func (v *Verifier) key(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if len(v.hsKeys.Keys) > 0 {
			return v.hsKeys, nil // each tried in turn
		}
	case *jwt.SigningMethodEd25519:
		if len(v.edKeys.Keys) > 0 {
			return v.edKeys, nil
		}
	}
	return nil, fmt.Errorf("algorithm %q not configured", t.Method.Alg())
}
