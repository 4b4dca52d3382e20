package token

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var (
	t0     = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	hsKey  = []byte("0123456789abcdef0123456789abcdef")
	hsKey2 = []byte("fedcba9876543210fedcba9876543210")
)

func edKeys(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// must lets a Mint call be used inline: must(t)(MintHS256(...)).
func must(t testing.TB) func(string, error) string {
	return func(tok string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("mint: %v", err)
		}
		return tok
	}
}

// rawToken signs arbitrary claims with any method, for the malformed cases
// that Mint refuses to produce.
func rawToken(t testing.TB, m jwt.SigningMethod, c jwt.Claims, key any) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(key)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return s
}

func TestVerify(t *testing.T) {
	pub, priv := edKeys(t)
	_, otherPriv := edKeys(t)
	both, err := NewVerifier(Config{HS256Key: hsKey, Ed25519PublicKey: pub, Leeway: DefaultLeeway})
	if err != nil {
		t.Fatal(err)
	}
	hsOnly, err := NewVerifier(Config{HS256Key: hsKey, Leeway: DefaultLeeway})
	if err != nil {
		t.Fatal(err)
	}
	edOnly, err := NewVerifier(Config{Ed25519PublicKey: pub, Leeway: DefaultLeeway})
	if err != nil {
		t.Fatal(err)
	}
	std := Claims{User: "alice", IssuedAt: t0, Expires: t0.Add(time.Hour)}
	hs := func(c Claims) string { return must(t)(MintHS256(hsKey, c)) }
	ed := func(c Claims) string { return must(t)(MintEdDSA(priv, c)) }
	with := func(f func(*Claims)) Claims { c := std; f(&c); return c }
	reg := func(sub string, exp time.Time) jwt.MapClaims {
		m := jwt.MapClaims{"iat": t0.Unix()}
		if sub != "" {
			m["sub"] = sub
		}
		if !exp.IsZero() {
			m["exp"] = exp.Unix()
		}
		return m
	}
	good := hs(std)
	parts := strings.Split(good, ".")
	noneTok := rawToken(t, jwt.SigningMethodNone, reg("alice", t0.Add(time.Hour)), jwt.UnsafeAllowNoneSignatureType)

	tests := []struct {
		name    string
		v       *Verifier
		token   string
		now     time.Time
		want    Identity
		wantErr error
	}{
		{"hs256 ok", both, good, t0, Identity{User: "alice", Expires: t0.Add(time.Hour)}, nil},
		{"eddsa ok", both, ed(std), t0, Identity{User: "alice", Expires: t0.Add(time.Hour)}, nil},
		{"device carried", hsOnly, hs(with(func(c *Claims) { c.Device = "phone-1" })), t0,
			Identity{User: "alice", Device: "phone-1", Expires: t0.Add(time.Hour)}, nil},
		{"hs256 forged key", both, must(t)(MintHS256(hsKey2, std)), t0, Identity{}, ErrInvalid},
		{"eddsa forged key", both, must(t)(MintEdDSA(otherPriv, std)), t0, Identity{}, ErrInvalid},
		{"payload swapped", both, parts[0] + "." + strings.Split(hs(with(func(c *Claims) { c.User = "mallory" })), ".")[1] + "." + parts[2], t0, Identity{}, ErrInvalid},
		{"signature stripped", both, parts[0] + "." + parts[1] + ".", t0, Identity{}, ErrInvalid},
		{"alg none", both, noneTok, t0, Identity{}, ErrInvalid},
		{"hs384 not accepted", both, rawToken(t, jwt.SigningMethodHS384, reg("alice", t0.Add(time.Hour)), hsKey), t0, Identity{}, ErrInvalid},
		{"hs256 when only eddsa", edOnly, good, t0, Identity{}, ErrInvalid},
		{"eddsa when only hs256", hsOnly, ed(std), t0, Identity{}, ErrInvalid},
		// Key confusion: an attacker who knows the public key HMACs with it.
		{"public key as hmac key", edOnly, rawToken(t, jwt.SigningMethodHS256, reg("alice", t0.Add(time.Hour)), []byte(pub)), t0, Identity{}, ErrInvalid},
		{"expired", both, good, t0.Add(time.Hour + DefaultLeeway + time.Second), Identity{}, ErrExpired},
		{"expired within leeway", both, good, t0.Add(time.Hour + DefaultLeeway - time.Second), Identity{User: "alice", Expires: t0.Add(time.Hour)}, nil},
		{"nbf in future", both, hs(with(func(c *Claims) { c.NotBefore = t0.Add(time.Minute) })), t0, Identity{}, ErrInvalid},
		{"nbf within leeway", both, hs(with(func(c *Claims) { c.NotBefore = t0.Add(10 * time.Second) })), t0, Identity{User: "alice", Expires: t0.Add(time.Hour)}, nil},
		{"iat in future", both, hs(with(func(c *Claims) { c.IssuedAt = t0.Add(time.Minute) })), t0, Identity{}, ErrInvalid},
		{"missing exp", both, rawToken(t, jwt.SigningMethodHS256, reg("alice", time.Time{}), hsKey), t0, Identity{}, ErrInvalid},
		{"missing sub", both, rawToken(t, jwt.SigningMethodHS256, reg("", t0.Add(time.Hour)), hsKey), t0, Identity{}, ErrInvalid},
		{"bad sub", both, rawToken(t, jwt.SigningMethodHS256, reg("al ice", t0.Add(time.Hour)), hsKey), t0, Identity{}, ErrInvalid},
		{"long sub", both, rawToken(t, jwt.SigningMethodHS256, reg(strings.Repeat("a", 65), t0.Add(time.Hour)), hsKey), t0, Identity{}, ErrInvalid},
		{"bad dev", both, rawToken(t, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix(), "dev": "ph/1"}, hsKey), t0, Identity{}, ErrInvalid},
		{"exp wrong type", both, rawToken(t, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": "tomorrow"}, hsKey), t0, Identity{}, ErrInvalid},
		{"empty", both, "", t0, Identity{}, ErrInvalid},
		{"garbage", both, "not.a.token", t0, Identity{}, ErrInvalid},
		{"oversized", both, parts[0] + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 4096)) + "." + parts[2], t0, Identity{}, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.v.Verify(tt.token, tt.now)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Verify err = %v, want %v", err, tt.wantErr)
			}
			if !got.Expires.Equal(tt.want.Expires) || got.User != tt.want.User || got.Device != tt.want.Device {
				t.Fatalf("Verify = %+v, want %+v", got, tt.want)
			}
			if errors.Is(err, ErrExpired) && errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v is both expired and invalid", err)
			}
		})
	}
}

func TestCheckDevice(t *testing.T) {
	tests := []struct {
		name   string
		bound  string
		device string
		ok     bool
	}{
		{"unbound any device", "", "tablet", true},
		{"bound same device", "phone", "phone", true},
		{"bound other device", "phone", "tablet", false},
		{"bound empty device", "phone", "", false},
	}
	v, err := NewVerifier(Config{HS256Key: hsKey})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := must(t)(MintHS256(hsKey, Claims{User: "bob", Device: tt.bound, IssuedAt: t0, Expires: t0.Add(time.Hour)}))
			id, err := v.Verify(tok, t0)
			if err != nil {
				t.Fatal(err)
			}
			err = id.CheckDevice(tt.device)
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("CheckDevice(%q) with dev %q = %v, want ok=%v", tt.device, tt.bound, err, tt.ok)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	pub, _ := edKeys(t)
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"hs256", Config{HS256Key: hsKey}, true},
		{"eddsa", Config{Ed25519PublicKey: pub}, true},
		{"both", Config{HS256Key: hsKey, Ed25519PublicKey: pub, Leeway: time.Minute}, true},
		{"none", Config{}, false},
		{"short hs256", Config{HS256Key: hsKey[:16]}, false},
		{"short ed25519", Config{Ed25519PublicKey: pub[:16]}, false},
		{"negative leeway", Config{HS256Key: hsKey, Leeway: -time.Second}, false},
		{"huge leeway", Config{HS256Key: hsKey, Leeway: time.Hour}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewVerifier(tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("NewVerifier err = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestMintRejects(t *testing.T) {
	_, priv := edKeys(t)
	exp := t0.Add(time.Hour)
	tests := []struct {
		name string
		mint func() (string, error)
	}{
		{"bad user", func() (string, error) { return MintHS256(hsKey, Claims{User: "a b", Expires: exp}) }},
		{"bad device", func() (string, error) { return MintHS256(hsKey, Claims{User: "a", Device: "x/y", Expires: exp}) }},
		{"no expiry", func() (string, error) { return MintHS256(hsKey, Claims{User: "a"}) }},
		{"short key", func() (string, error) { return MintHS256(hsKey[:8], Claims{User: "a", Expires: exp}) }},
		{"bad ed key", func() (string, error) { return MintEdDSA(priv[:10], Claims{User: "a", Expires: exp}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tok, err := tt.mint(); err == nil {
				t.Fatalf("minted %q, want error", tok)
			}
		})
	}
}

func FuzzVerify(f *testing.F) {
	pub, priv := edKeys(f)
	v, err := NewVerifier(Config{HS256Key: hsKey, Ed25519PublicKey: pub, Leeway: DefaultLeeway})
	if err != nil {
		f.Fatal(err)
	}
	c := Claims{User: "alice", Device: "d1", IssuedAt: t0, Expires: t0.Add(time.Hour)}
	minted := map[string]bool{
		must(f)(MintHS256(hsKey, c)): true,
		must(f)(MintEdDSA(priv, c)):  true,
	}
	for tok := range minted {
		f.Add(tok)
		f.Add(tok[:len(tok)-1])
		f.Add(strings.Replace(tok, ".", "..", 1))
	}
	f.Add("")
	f.Add("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := v.Verify(s, t0)
		if err == nil {
			if !minted[s] {
				t.Fatalf("Verify(%q) = %+v: a token we never minted verified", s, id)
			}
			return
		}
		if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrExpired) {
			t.Fatalf("Verify(%q) err %v is neither ErrInvalid nor ErrExpired", s, err)
		}
	})
}
