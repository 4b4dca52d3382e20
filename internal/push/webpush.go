package push

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Web Push message encryption (RFC 8291, "aes128gcm" of RFC 8188 in one
// record) and VAPID (RFC 8292), on the standard library's ECDH, HKDF and
// AES-GCM; the VAPID JWT is signed with golang-jwt.

// webPushRecordSize is the record size the header announces: the whole
// message is one record, and a push service takes at least 4096 bytes.
const webPushRecordSize = 4096

// encryptWebPush encrypts plaintext to the subscription keys uaPublic and
// authSecret: header (salt, record size, the sender's ephemeral public
// key) then the one record, plaintext || 0x02 sealed with AES-128-GCM.
// asPrivate and salt are fresh for every message (they are parameters for
// RFC 8291's test vector).
func encryptWebPush(plaintext, uaPublic, authSecret []byte, asPrivate *ecdh.PrivateKey, salt []byte) ([]byte, error) {
	ua, err := ecdh.P256().NewPublicKey(uaPublic)
	if err != nil {
		return nil, fmt.Errorf("webpush: p256dh: %w", err)
	}
	if len(authSecret) != 16 || len(salt) != 16 {
		return nil, errors.New("webpush: auth secret and salt are 16 bytes")
	}
	shared, err := asPrivate.ECDH(ua)
	if err != nil {
		return nil, fmt.Errorf("webpush: ecdh: %w", err)
	}
	asPublic := asPrivate.PublicKey().Bytes()
	keyInfo := append(append([]byte("WebPush: info\x00"), uaPublic...), asPublic...)
	ikm, err := hkdf.Key(sha256.New, shared, authSecret, string(keyInfo), 32)
	if err != nil {
		return nil, err
	}
	prk, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	if len(plaintext)+1+gcm.Overhead() > webPushRecordSize {
		return nil, fmt.Errorf("webpush: a payload of %d bytes is over one record", len(plaintext))
	}
	out := make([]byte, 0, 16+4+1+len(asPublic)+len(plaintext)+1+gcm.Overhead())
	out = append(out, salt...)
	out = binary.BigEndian.AppendUint32(out, webPushRecordSize)
	out = append(out, byte(len(asPublic)))
	out = append(out, asPublic...)
	record := append(append([]byte(nil), plaintext...), 0x02) // the last record's delimiter, no padding
	return gcm.Seal(out, nonce, record, nil), nil
}

// EncryptWebPush encrypts plaintext for a subscription with a fresh
// ephemeral key and salt.
func EncryptWebPush(plaintext, p256dh, auth []byte) ([]byte, error) {
	k, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	return encryptWebPush(plaintext, p256dh, auth, k, salt)
}

// vapid signs the Authorization of Web Push requests (RFC 8292): a JWT
// per push service origin, for 12 hours, reused until an hour before it
// ends.
type vapid struct {
	key     *ecdsa.PrivateKey
	public  string // base64url of the uncompressed public key (k=)
	subject string
	now     func() time.Time

	mu     sync.Mutex
	tokens map[string]vapidToken
}

type vapidToken struct {
	jwt string
	exp time.Time
}

const vapidLifetime = 12 * time.Hour

// loadECKey reads a P-256 private key in PEM (SEC 1 "EC PRIVATE KEY" or
// PKCS #8 "PRIVATE KEY").
func loadECKey(file string) (*ecdsa.PrivateKey, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: no PEM block", file)
	}
	if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: not an EC key", file)
	}
	return ek, nil
}

// VAPIDPublicKey is the public key of the VAPID key in file, as a page
// passes it to pushManager.subscribe (applicationServerKey) and as the
// k= of every request: the uncompressed P-256 point, base64url without
// padding.
func VAPIDPublicKey(file string) (string, error) {
	k, err := loadECKey(file)
	if err != nil {
		return "", fmt.Errorf("push: vapid key: %w", err)
	}
	v, err := newVAPID(k, "", time.Now)
	if err != nil {
		return "", err
	}
	return v.public, nil
}

func newVAPID(key *ecdsa.PrivateKey, subject string, now func() time.Time) (*vapid, error) {
	pub, err := key.PublicKey.ECDH()
	if err != nil || key.Curve.Params().Name != "P-256" {
		return nil, errors.New("webpush: the VAPID key must be a P-256 key")
	}
	return &vapid{key: key, public: base64.RawURLEncoding.EncodeToString(pub.Bytes()), subject: subject, now: now, tokens: map[string]vapidToken{}}, nil
}

// header returns the Authorization value for a request to endpoint.
func (v *vapid) header(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", err
	}
	aud := u.Scheme + "://" + u.Host
	now := v.now()
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.tokens[aud]
	if !ok || now.After(t.exp.Add(-time.Hour)) {
		exp := now.Add(vapidLifetime)
		s, err := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"aud": aud, "exp": exp.Unix(), "sub": v.subject}).SignedString(v.key)
		if err != nil {
			return "", err
		}
		t = vapidToken{jwt: s, exp: exp}
		if len(v.tokens) > 1024 {
			clear(v.tokens)
		}
		v.tokens[aud] = t
	}
	return "vapid t=" + t.jwt + ", k=" + v.public, nil
}
