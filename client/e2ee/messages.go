package e2ee

import (
	"crypto/subtle"
	"errors"
	"fmt"
)

// Wire formats of libsignal (rust/protocol/src/proto/wire.proto): a version
// byte (high nibble: the message version, low nibble: the newest version the
// sender knows), the protobuf, then an 8-byte truncated HMAC-SHA256
// (SignalMessage) or a 64-byte XEdDSA signature (SenderKeyMessage).

// Message versions.
const (
	VersionX3DH  = 3 // classic X3DH sessions (decrypt floor of libsignal)
	VersionPQXDH = 4 // PQXDH sessions (ML-KEM-1024 prekey)
	// The low nibble of the version byte is the newest version the sender
	// speaks. A version 3 session writes 3 (as libsignal did before PQXDH,
	// and as its Java/C ports still check by re-serializing), a version 4
	// session 4 (today's libsignal); readers only look at the high nibble.
	// senderKeyVersion is the version of group messages.
	senderKeyVersion = 3
	macLen           = 8
	sigLen           = 64
)

// MessageType says how to read a ciphertext: libsignal's
// CiphertextMessageType values.
type MessageType uint8

const (
	TypeSignal    MessageType = 2 // SignalMessage: an established session
	TypePreKey    MessageType = 3 // PreKeySignalMessage: the first messages of a session
	TypeSenderKey MessageType = 7 // SenderKeyMessage: a group message
)

// Errors of message parsing.
var (
	ErrMalformed      = errors.New("e2ee: malformed message")
	ErrVersion        = errors.New("e2ee: unsupported message version")
	ErrBadMAC         = errors.New("e2ee: bad message MAC")
	ErrDuplicate      = errors.New("e2ee: duplicate message (message key already used)")
	ErrTooFarAhead    = errors.New("e2ee: message too far in the future")
	ErrNoSession      = errors.New("e2ee: no session with this device")
	ErrInvalidPreKey  = errors.New("e2ee: unknown prekey id")
	ErrUntrusted      = errors.New("e2ee: identity key changed")
	ErrNoSenderKey    = errors.New("e2ee: no sender key for this group and sender")
	ErrBadBundle      = errors.New("e2ee: bad prekey bundle")
	ErrDecryptFailure = errors.New("e2ee: decryption failed")
	// ErrDowngrade: a bundle without a KEM prekey, or a version 3 (classic
	// X3DH) first message for a new session; a server that strips the
	// post-quantum prekey must not get a weaker session.
	ErrDowngrade = errors.New("e2ee: downgrade to classic X3DH refused")
	// ErrReusedBaseKey: a first message whose base key already started a
	// session on the same keys (a replay).
	ErrReusedBaseKey = errors.New("e2ee: reused base key (replayed first message)")
)

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, a...)...)
}

// SignalMessage is a Double Ratchet message.
type SignalMessage struct {
	Version         uint8
	RatchetKey      PublicKey
	Counter         uint32
	PreviousCounter uint32
	Ciphertext      []byte
	Serialized      []byte // version byte || protobuf || MAC
}

func newSignalMessage(version uint8, macKey []byte, ratchet PublicKey, counter, prev uint32, ct []byte, sender, receiver PublicKey) SignalMessage {
	var w pbWriter
	w.b = append(w.b, version<<4|version)
	w.bytes(1, ratchet.Bytes())
	w.uint32(2, counter)
	w.uint32(3, prev)
	w.bytes(4, ct)
	mac := signalMAC(macKey, sender, receiver, w.b)
	return SignalMessage{Version: version, RatchetKey: ratchet, Counter: counter, PreviousCounter: prev,
		Ciphertext: ct, Serialized: append(w.b, mac...)}
}

func signalMAC(macKey []byte, sender, receiver PublicKey, msg []byte) []byte {
	return hmacSHA256(macKey, sender.Bytes(), receiver.Bytes(), msg)[:macLen]
}

func (m SignalMessage) verifyMAC(macKey []byte, sender, receiver PublicKey) bool {
	n := len(m.Serialized) - macLen
	want := signalMAC(macKey, sender, receiver, m.Serialized[:n])
	return subtle.ConstantTimeCompare(want, m.Serialized[n:]) == 1
}

func checkVersion(b byte) (uint8, error) {
	v := b >> 4
	if v < VersionX3DH || v > VersionPQXDH {
		return 0, fmt.Errorf("%w: %d", ErrVersion, v)
	}
	return v, nil
}

// ParseSignalMessage decodes a serialized SignalMessage (the MAC is checked
// on decryption, where the keys are known).
func ParseSignalMessage(b []byte) (SignalMessage, error) {
	var m SignalMessage
	if len(b) < 1+macLen {
		return m, malformed("SignalMessage of %d bytes", len(b))
	}
	v, err := checkVersion(b[0])
	if err != nil {
		return m, err
	}
	f, err := pbParse(b[1 : len(b)-macLen])
	if err != nil {
		return m, malformed("SignalMessage protobuf")
	}
	rk, ok1, err1 := pbBytes(f, 1)
	ctr, ok2, err2 := pbUint32(f, 2)
	prev, _, err3 := pbUint32(f, 3)
	ct, ok4, err4 := pbBytes(f, 4)
	if err := errors.Join(err1, err2, err3, err4); err != nil || !ok1 || !ok2 || !ok4 {
		return m, malformed("SignalMessage fields")
	}
	key, err := DecodePublicKey(rk)
	if err != nil {
		return m, err
	}
	return SignalMessage{Version: v, RatchetKey: key, Counter: ctr, PreviousCounter: prev,
		Ciphertext: append([]byte(nil), ct...), Serialized: append([]byte(nil), b...)}, nil
}

// PreKeySignalMessage starts a session: the initiator's keys and the first
// SignalMessage.
type PreKeySignalMessage struct {
	Version         uint8
	RegistrationID  uint32
	PreKeyID        uint32 // valid if HasPreKey
	HasPreKey       bool
	SignedPreKeyID  uint32
	KyberPreKeyID   uint32 // version 4 only
	KyberCiphertext []byte // version 4 only: KEMType || ML-KEM-1024 ciphertext
	BaseKey         PublicKey
	IdentityKey     PublicKey
	Message         SignalMessage
	Serialized      []byte
}

func (p *PreKeySignalMessage) encode() {
	var w pbWriter
	w.b = append(w.b, p.Version<<4|p.Version)
	if p.HasPreKey {
		w.uint32(1, p.PreKeyID)
	}
	w.bytes(2, p.BaseKey.Bytes())
	w.bytes(3, p.IdentityKey.Bytes())
	w.bytes(4, p.Message.Serialized)
	w.uint32(5, p.RegistrationID)
	w.uint32(6, p.SignedPreKeyID)
	if p.Version >= VersionPQXDH {
		w.uint32(7, p.KyberPreKeyID)
		w.bytes(8, p.KyberCiphertext)
	}
	p.Serialized = w.b
}

// ParsePreKeySignalMessage decodes a serialized PreKeySignalMessage.
func ParsePreKeySignalMessage(b []byte) (PreKeySignalMessage, error) {
	var p PreKeySignalMessage
	if len(b) < 1 {
		return p, malformed("empty PreKeySignalMessage")
	}
	v, err := checkVersion(b[0])
	if err != nil {
		return p, err
	}
	f, err := pbParse(b[1:])
	if err != nil {
		return p, malformed("PreKeySignalMessage protobuf")
	}
	pk, hasPK, e1 := pbUint32(f, 1)
	base, ok2, e2 := pbBytes(f, 2)
	id, ok3, e3 := pbBytes(f, 3)
	msg, ok4, e4 := pbBytes(f, 4)
	reg, _, e5 := pbUint32(f, 5)
	spk, ok6, e6 := pbUint32(f, 6)
	kid, hasKID, e7 := pbUint32(f, 7)
	kct, hasKCT, e8 := pbBytes(f, 8)
	if err := errors.Join(e1, e2, e3, e4, e5, e6, e7, e8); err != nil || !ok2 || !ok3 || !ok4 || !ok6 {
		return p, malformed("PreKeySignalMessage fields")
	}
	if hasKID != hasKCT {
		return p, malformed("both or neither kyber_pre_key_id and kyber_ciphertext")
	}
	if v >= VersionPQXDH && !hasKID {
		return p, malformed("version 4 PreKeySignalMessage without a KEM ciphertext")
	}
	p = PreKeySignalMessage{Version: v, RegistrationID: reg, PreKeyID: pk, HasPreKey: hasPK,
		SignedPreKeyID: spk, Serialized: append([]byte(nil), b...)}
	if v >= VersionPQXDH {
		p.KyberPreKeyID, p.KyberCiphertext = kid, append([]byte(nil), kct...)
	}
	if p.BaseKey, err = DecodePublicKey(base); err != nil {
		return p, err
	}
	if p.IdentityKey, err = DecodePublicKey(id); err != nil {
		return p, err
	}
	if p.Message, err = ParseSignalMessage(msg); err != nil {
		return p, err
	}
	if p.Message.Version != v {
		return p, malformed("inner message version %d in a version %d PreKeySignalMessage", p.Message.Version, v)
	}
	return p, nil
}

// SenderKeyFormat chooses the protobuf layout of group messages.
type SenderKeyFormat uint8

const (
	// FormatModern is today's libsignal: a distribution UUID and a chain id.
	FormatModern SenderKeyFormat = iota
	// FormatLegacy is libsignal-protocol-c/Java's (and go.mau.fi/libsignal's):
	// only a key id. Kept for interoperability.
	FormatLegacy
)

// SenderKeyMessage is a group message, signed by the sender's signing key.
type SenderKeyMessage struct {
	DistributionID [16]byte
	ChainID        uint32
	Iteration      uint32
	Ciphertext     []byte
	Serialized     []byte
}

func encodeSenderKeyMessage(f SenderKeyFormat, dist [16]byte, chain, iter uint32, ct []byte, sign PrivateKey) []byte {
	var w pbWriter
	w.b = append(w.b, senderKeyVersion<<4|senderKeyVersion)
	if f == FormatLegacy {
		w.uint32(1, chain)
		w.uint32(2, iter)
		w.bytes(3, ct)
	} else {
		w.bytes(1, dist[:])
		w.uint32(2, chain)
		w.uint32(3, iter)
		w.bytes(4, ct)
	}
	sig := sign.Sign(w.b)
	return append(w.b, sig[:]...)
}

// ParseSenderKeyMessage decodes a group message of the given format.
func ParseSenderKeyMessage(b []byte, f SenderKeyFormat) (SenderKeyMessage, error) {
	var m SenderKeyMessage
	if len(b) < 1+sigLen {
		return m, malformed("SenderKeyMessage of %d bytes", len(b))
	}
	if b[0]>>4 != senderKeyVersion {
		return m, fmt.Errorf("%w: sender key %d", ErrVersion, b[0]>>4)
	}
	fs, err := pbParse(b[1 : len(b)-sigLen])
	if err != nil {
		return m, malformed("SenderKeyMessage protobuf")
	}
	var ok1, ok2, ok3 bool
	var e0, e1, e2, e3 error
	var dist []byte
	if f == FormatLegacy {
		m.ChainID, ok1, e1 = pbUint32(fs, 1)
		m.Iteration, ok2, e2 = pbUint32(fs, 2)
		m.Ciphertext, ok3, e3 = pbBytes(fs, 3)
	} else {
		var okd bool
		dist, okd, e0 = pbBytes(fs, 1)
		if !okd || len(dist) != 16 {
			return m, malformed("SenderKeyMessage distribution id")
		}
		copy(m.DistributionID[:], dist)
		m.ChainID, ok1, e1 = pbUint32(fs, 2)
		m.Iteration, ok2, e2 = pbUint32(fs, 3)
		m.Ciphertext, ok3, e3 = pbBytes(fs, 4)
	}
	if err := errors.Join(e0, e1, e2, e3); err != nil || !ok1 || !ok2 || !ok3 {
		return m, malformed("SenderKeyMessage fields")
	}
	m.Ciphertext = append([]byte(nil), m.Ciphertext...)
	m.Serialized = append([]byte(nil), b...)
	return m, nil
}

func (m SenderKeyMessage) verify(signing PublicKey) bool {
	n := len(m.Serialized) - sigLen
	return signing.Verify(m.Serialized[:n], m.Serialized[n:])
}

// SenderKeyDistributionMessage hands a sender's chain key and signing key
// to a group member, over a pairwise session.
type SenderKeyDistributionMessage struct {
	DistributionID [16]byte
	ChainID        uint32
	Iteration      uint32
	ChainKey       [32]byte
	SigningKey     PublicKey
}

// Encode serializes the message in the given format.
func (d SenderKeyDistributionMessage) Encode(f SenderKeyFormat) []byte {
	var w pbWriter
	w.b = append(w.b, senderKeyVersion<<4|senderKeyVersion)
	if f == FormatLegacy {
		w.uint32(1, d.ChainID)
		w.uint32(2, d.Iteration)
		w.bytes(3, d.ChainKey[:])
		w.bytes(4, d.SigningKey.Bytes())
	} else {
		w.bytes(1, d.DistributionID[:])
		w.uint32(2, d.ChainID)
		w.uint32(3, d.Iteration)
		w.bytes(4, d.ChainKey[:])
		w.bytes(5, d.SigningKey.Bytes())
	}
	return w.b
}

// ParseSenderKeyDistributionMessage decodes a distribution message.
func ParseSenderKeyDistributionMessage(b []byte, f SenderKeyFormat) (SenderKeyDistributionMessage, error) {
	var d SenderKeyDistributionMessage
	if len(b) < 1 {
		return d, malformed("empty SenderKeyDistributionMessage")
	}
	if b[0]>>4 != senderKeyVersion {
		return d, fmt.Errorf("%w: sender key %d", ErrVersion, b[0]>>4)
	}
	fs, err := pbParse(b[1:])
	if err != nil {
		return d, malformed("SenderKeyDistributionMessage protobuf")
	}
	var ck, sk []byte
	var ok1, ok2, ok3, ok4 bool
	var e0, e1, e2, e3, e4 error
	if f == FormatLegacy {
		d.ChainID, ok1, e1 = pbUint32(fs, 1)
		d.Iteration, ok2, e2 = pbUint32(fs, 2)
		ck, ok3, e3 = pbBytes(fs, 3)
		sk, ok4, e4 = pbBytes(fs, 4)
	} else {
		var dist []byte
		var okd bool
		dist, okd, e0 = pbBytes(fs, 1)
		if !okd || len(dist) != 16 {
			return d, malformed("SenderKeyDistributionMessage distribution id")
		}
		copy(d.DistributionID[:], dist)
		d.ChainID, ok1, e1 = pbUint32(fs, 2)
		d.Iteration, ok2, e2 = pbUint32(fs, 3)
		ck, ok3, e3 = pbBytes(fs, 4)
		sk, ok4, e4 = pbBytes(fs, 5)
	}
	if err := errors.Join(e0, e1, e2, e3, e4); err != nil || !ok1 || !ok2 || !ok3 || !ok4 || len(ck) != 32 {
		return d, malformed("SenderKeyDistributionMessage fields")
	}
	copy(d.ChainKey[:], ck)
	if d.SigningKey, err = DecodePublicKey(sk); err != nil {
		return d, err
	}
	return d, nil
}
