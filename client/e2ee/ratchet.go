package e2ee

import (
	"bytes"
	"fmt"
)

// Limits of the Double Ratchet, libsignal's values (rust/protocol/src/consts.rs).
const (
	// MaxForwardJump is how many messages of one chain a message may skip
	// (a counter further ahead fails with ErrTooFarAhead).
	MaxForwardJump = 25000
	// MaxSkippedKeys is how many skipped message keys a receiver chain
	// keeps for late messages; the oldest are dropped beyond it.
	MaxSkippedKeys = 2000
	// MaxReceiverChains is how many receiver chains a session keeps.
	MaxReceiverChains = 5
	// MaxArchivedStates is how many earlier sessions a record keeps with a
	// device (after a re-initiation, late messages of the old one decrypt).
	MaxArchivedStates = 40
)

type skippedKey struct {
	Index uint32   `json:"i"`
	Seed  [32]byte `json:"s"`
}

type receiverChain struct {
	RatchetKey PublicKey    `json:"rk"`
	Chain      chainKey     `json:"ck"`
	Skipped    []skippedKey `json:"sk,omitempty"` // oldest first
}

type senderChain struct {
	Ratchet KeyPair  `json:"rk"`
	Chain   chainKey `json:"ck"`
}

// pendingPreKey is set on the initiator's side until the first answer: every
// message is then wrapped in a PreKeySignalMessage.
type pendingPreKey struct {
	PreKeyID        uint32    `json:"pk"`
	HasPreKey       bool      `json:"has_pk"`
	SignedPreKeyID  uint32    `json:"spk"`
	KyberPreKeyID   uint32    `json:"kpk"`
	KyberCiphertext []byte    `json:"kct,omitempty"`
	BaseKey         PublicKey `json:"base"`
}

// sessionState is one Double Ratchet session with one device.
type sessionState struct {
	Version         uint8           `json:"v"`
	LocalIdentity   PublicKey       `json:"lid"`
	RemoteIdentity  PublicKey       `json:"rid"`
	Root            [32]byte        `json:"root"`
	PreviousCounter uint32          `json:"pc"`
	Sender          senderChain     `json:"send"`
	Receivers       []receiverChain `json:"recv"` // oldest first
	Pending         *pendingPreKey  `json:"pending,omitempty"`
	LocalRegID      uint32          `json:"lreg"`
	RemoteRegID     uint32          `json:"rreg"`
	BaseKey         PublicKey       `json:"base"` // the initiator's base key: names the session
}

func (s *sessionState) clone() *sessionState {
	c := *s
	c.Receivers = make([]receiverChain, len(s.Receivers))
	for i, r := range s.Receivers {
		r.Skipped = append([]skippedKey(nil), r.Skipped...)
		c.Receivers[i] = r
	}
	if s.Pending != nil {
		p := *s.Pending
		c.Pending = &p
	}
	return &c
}

func (s *sessionState) receiverChain(k PublicKey) *receiverChain {
	for i := range s.Receivers {
		if s.Receivers[i].RatchetKey == k {
			return &s.Receivers[i]
		}
	}
	return nil
}

type aliceParams struct {
	identity, base    KeyPair
	theirIdentity     PublicKey
	theirSignedPreKey PublicKey
	theirOneTime      *PublicKey
	theirRatchet      PublicKey
	theirKEM          []byte // nil: classic X3DH (version 3)
}

var discontinuity = bytes.Repeat([]byte{0xFF}, 32)

func agreeAll(pairs ...[2]any) ([]byte, error) {
	out := append([]byte(nil), discontinuity...)
	for _, p := range pairs {
		s, err := p[0].(PrivateKey).Agree(p[1].(PublicKey))
		if err != nil {
			return nil, err
		}
		out = append(out, s[:]...)
	}
	return out, nil
}

// aliceSession runs X3DH/PQXDH as the initiator and returns the session and
// the KEM ciphertext (nil in version 3).
func aliceSession(p aliceParams) (*sessionState, []byte, error) {
	pairs := [][2]any{
		{p.identity.Private, p.theirSignedPreKey},
		{p.base.Private, p.theirIdentity},
		{p.base.Private, p.theirSignedPreKey},
	}
	if p.theirOneTime != nil {
		pairs = append(pairs, [2]any{p.base.Private, *p.theirOneTime})
	}
	secret, err := agreeAll(pairs...)
	if err != nil {
		return nil, nil, err
	}
	version := uint8(VersionX3DH)
	var kct []byte
	if p.theirKEM != nil {
		ss, ct, err := kemEncapsulate(p.theirKEM)
		if err != nil {
			return nil, nil, err
		}
		secret = append(secret, ss...)
		kct, version = ct, VersionPQXDH
	}
	root, ck := deriveInitial(secret, version == VersionPQXDH)
	sending := GenerateKeyPair()
	root, sck, err := createChain(root, p.theirRatchet, sending.Private)
	if err != nil {
		return nil, nil, err
	}
	return &sessionState{
		Version: version, LocalIdentity: p.identity.Public, RemoteIdentity: p.theirIdentity,
		Root: root, Sender: senderChain{Ratchet: sending, Chain: sck},
		Receivers: []receiverChain{{RatchetKey: p.theirRatchet, Chain: ck}},
		BaseKey:   p.base.Public,
	}, kct, nil
}

type bobParams struct {
	identity, signedPreKey KeyPair
	oneTime                *KeyPair
	ratchet                KeyPair
	kem                    *KEMKeyPair
	kemCiphertext          []byte
	theirIdentity          PublicKey
	theirBaseKey           PublicKey
}

// bobSession runs X3DH/PQXDH as the responder.
func bobSession(p bobParams) (*sessionState, error) {
	pairs := [][2]any{
		{p.signedPreKey.Private, p.theirIdentity},
		{p.identity.Private, p.theirBaseKey},
		{p.signedPreKey.Private, p.theirBaseKey},
	}
	if p.oneTime != nil {
		pairs = append(pairs, [2]any{p.oneTime.Private, p.theirBaseKey})
	}
	secret, err := agreeAll(pairs...)
	if err != nil {
		return nil, err
	}
	version := uint8(VersionX3DH)
	if p.kem != nil {
		ss, err := p.kem.decapsulate(p.kemCiphertext)
		if err != nil {
			return nil, err
		}
		secret = append(secret, ss...)
		version = VersionPQXDH
	}
	root, ck := deriveInitial(secret, version == VersionPQXDH)
	return &sessionState{
		Version: version, LocalIdentity: p.identity.Public, RemoteIdentity: p.theirIdentity,
		Root: root, Sender: senderChain{Ratchet: p.ratchet, Chain: ck},
		BaseKey: p.theirBaseKey,
	}, nil
}

// encrypt seals plaintext on s (advancing its sending chain) and returns
// the message and its type.
func (s *sessionState) encrypt(plain []byte) (MessageType, []byte) {
	ck := s.Sender.Chain
	mk := deriveMessageKeys(ck.messageSeed())
	ct := aesCBCEncrypt(mk.Cipher[:], mk.IV[:], plain)
	msg := newSignalMessage(s.Version, mk.MAC[:], s.Sender.Ratchet.Public, ck.Index, s.PreviousCounter, ct,
		s.LocalIdentity, s.RemoteIdentity)
	s.Sender.Chain = ck.next()
	if s.Pending == nil {
		return TypeSignal, msg.Serialized
	}
	p := PreKeySignalMessage{
		Version: s.Version, RegistrationID: s.LocalRegID, PreKeyID: s.Pending.PreKeyID,
		HasPreKey: s.Pending.HasPreKey, SignedPreKeyID: s.Pending.SignedPreKeyID,
		KyberPreKeyID: s.Pending.KyberPreKeyID, KyberCiphertext: s.Pending.KyberCiphertext,
		BaseKey: s.Pending.BaseKey, IdentityKey: s.LocalIdentity, Message: msg,
	}
	p.encode()
	return TypePreKey, p.Serialized
}

// decrypt opens m on s. s must be a copy: on error it is left half-way and
// the caller drops it.
func (s *sessionState) decrypt(m SignalMessage) ([]byte, error) {
	if m.Version != s.Version {
		return nil, fmt.Errorf("%w: message version %d on a version %d session", ErrVersion, m.Version, s.Version)
	}
	rc := s.receiverChain(m.RatchetKey)
	if rc == nil {
		root, rck, err := createChain(s.Root, m.RatchetKey, s.Sender.Ratchet.Private)
		if err != nil {
			return nil, err
		}
		next := GenerateKeyPair()
		root, sck, err := createChain(root, m.RatchetKey, next.Private)
		if err != nil {
			return nil, err
		}
		s.Root = root
		s.Receivers = append(s.Receivers, receiverChain{RatchetKey: m.RatchetKey, Chain: rck})
		if len(s.Receivers) > MaxReceiverChains {
			s.Receivers = s.Receivers[len(s.Receivers)-MaxReceiverChains:]
		}
		s.PreviousCounter = max(s.Sender.Chain.Index, 1) - 1
		s.Sender = senderChain{Ratchet: next, Chain: sck}
		rc = &s.Receivers[len(s.Receivers)-1]
	}
	seed, err := rc.messageSeed(m.Counter)
	if err != nil {
		return nil, err
	}
	mk := deriveMessageKeys(seed)
	if !m.verifyMAC(mk.MAC[:], s.RemoteIdentity, s.LocalIdentity) {
		return nil, ErrBadMAC
	}
	plain, err := aesCBCDecrypt(mk.Cipher[:], mk.IV[:], m.Ciphertext)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecryptFailure, err)
	}
	s.Pending = nil
	return plain, nil
}

// messageSeed returns the message key seed of counter, from the skipped
// keys or by advancing the chain (storing what it skips).
func (rc *receiverChain) messageSeed(counter uint32) ([32]byte, error) {
	if counter < rc.Chain.Index {
		for i, k := range rc.Skipped {
			if k.Index == counter {
				rc.Skipped = append(rc.Skipped[:i:i], rc.Skipped[i+1:]...)
				return k.Seed, nil
			}
		}
		return [32]byte{}, fmt.Errorf("%w: counter %d, chain at %d", ErrDuplicate, counter, rc.Chain.Index)
	}
	if counter-rc.Chain.Index > MaxForwardJump {
		return [32]byte{}, fmt.Errorf("%w: counter %d, chain at %d (limit %d)", ErrTooFarAhead, counter, rc.Chain.Index, MaxForwardJump)
	}
	for rc.Chain.Index < counter {
		rc.Skipped = append(rc.Skipped, skippedKey{Index: rc.Chain.Index, Seed: rc.Chain.messageSeed()})
		if len(rc.Skipped) > MaxSkippedKeys {
			rc.Skipped = rc.Skipped[len(rc.Skipped)-MaxSkippedKeys:]
		}
		rc.Chain = rc.Chain.next()
	}
	seed := rc.Chain.messageSeed()
	rc.Chain = rc.Chain.next()
	return seed, nil
}
