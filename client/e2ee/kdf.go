package e2ee

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
)

// Labels of libsignal's key derivations.
const (
	labelX3DH        = "WhisperText"
	labelPQXDH       = "WhisperText_X25519_SHA-256_CRYSTALS-KYBER-1024"
	labelRatchet     = "WhisperRatchet"
	labelMessageKeys = "WhisperMessageKeys"
	labelGroup       = "WhisperGroup"
)

func hmacSHA256(key []byte, data ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, d := range data {
		m.Write(d)
	}
	return m.Sum(nil)
}

func hkdfSHA256(secret, salt []byte, info string, n int) []byte {
	out, err := hkdf.Key(sha256.New, secret, salt, info, n)
	if err != nil {
		panic("e2ee: hkdf: " + err.Error())
	}
	return out
}

// chainKey is a symmetric-ratchet chain key (KDF_CK: HMAC-SHA256 with
// 0x01 for the message key seed and 0x02 for the next chain key).
type chainKey struct {
	Key   [32]byte `json:"key"`
	Index uint32   `json:"index"`
}

func (c chainKey) next() chainKey {
	var n chainKey
	copy(n.Key[:], hmacSHA256(c.Key[:], []byte{0x02}))
	n.Index = c.Index + 1
	return n
}

func (c chainKey) messageSeed() [32]byte {
	var s [32]byte
	copy(s[:], hmacSHA256(c.Key[:], []byte{0x01}))
	return s
}

// messageKeys are the AES-256-CBC key, the HMAC key and the IV of one
// pairwise message.
type messageKeys struct {
	Cipher [32]byte
	MAC    [32]byte
	IV     [16]byte
}

func deriveMessageKeys(seed [32]byte) messageKeys {
	okm := hkdfSHA256(seed[:], nil, labelMessageKeys, 80)
	var k messageKeys
	copy(k.Cipher[:], okm[:32])
	copy(k.MAC[:], okm[32:64])
	copy(k.IV[:], okm[64:80])
	return k
}

// createChain is KDF_RK: a DH ratchet step from root key rk.
func createChain(rk [32]byte, their PublicKey, our PrivateKey) (root [32]byte, ck chainKey, err error) {
	shared, err := our.Agree(their)
	if err != nil {
		return root, ck, err
	}
	okm := hkdfSHA256(shared[:], rk[:], labelRatchet, 64)
	copy(root[:], okm[:32])
	copy(ck.Key[:], okm[32:])
	return root, ck, nil
}

// deriveInitial turns the X3DH/PQXDH secret input into the first root key
// and chain key.
func deriveInitial(secret []byte, pq bool) (root [32]byte, ck chainKey) {
	label := labelX3DH
	if pq {
		label = labelPQXDH
	}
	okm := hkdfSHA256(secret, nil, label, 64)
	copy(root[:], okm[:32])
	copy(ck.Key[:], okm[32:])
	return root, ck
}

var errPadding = errors.New("e2ee: bad padding")

func aesCBCEncrypt(key, iv, plain []byte) []byte {
	b, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	pad := aes.BlockSize - len(plain)%aes.BlockSize
	buf := make([]byte, len(plain)+pad)
	copy(buf, plain)
	for i := len(plain); i < len(buf); i++ {
		buf[i] = byte(pad)
	}
	cipher.NewCBCEncrypter(b, iv).CryptBlocks(buf, buf)
	return buf
}

func aesCBCDecrypt(key, iv, ct []byte) ([]byte, error) {
	if len(ct) == 0 || len(ct)%aes.BlockSize != 0 {
		return nil, errPadding
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(ct))
	cipher.NewCBCDecrypter(b, iv).CryptBlocks(out, ct)
	pad := int(out[len(out)-1])
	if pad == 0 || pad > aes.BlockSize {
		return nil, errPadding
	}
	for _, c := range out[len(out)-pad:] {
		if int(c) != pad {
			return nil, errPadding
		}
	}
	return out[:len(out)-pad], nil
}
