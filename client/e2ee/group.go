package e2ee

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
)

// Sender Keys (libsignal's group cipher): each member device has, per
// group, a chain key and a signing key. It hands both to every member over
// the pairwise sessions (a SenderKeyDistributionMessage); then each group
// message is encrypted once, whatever the group's size. The chain advances
// per message (HMAC-SHA256, 0x01 message seed, 0x02 next chain key); the
// message key is HKDF(seed, "WhisperGroup") → IV(16) || AES-256 key(32).

// MaxSenderKeyStates is how many chains a record keeps per (group, sender).
const MaxSenderKeyStates = 5

type senderKeyState struct {
	DistributionID [16]byte     `json:"dist"`
	ChainID        uint32       `json:"chain_id"`
	Chain          chainKey     `json:"ck"`
	SigningPub     PublicKey    `json:"sign_pub"`
	SigningPriv    *PrivateKey  `json:"sign_priv,omitempty"`
	Skipped        []skippedKey `json:"sk,omitempty"`
}

type senderKeyRecord struct {
	States []senderKeyState `json:"states"` // newest first
}

func senderKeyKey(group string, sender Address) string { return "sk/" + group + "/" + sender.String() }

// SetSenderKeyFormat is not per device: groups carry their format. See
// GroupDistribution.

// GroupDistribution returns this device's SenderKeyDistributionMessage for
// group (creating its sender key on first use, or after RotateGroup), to be
// sent to every member device over the pairwise sessions.
func (d *Device) GroupDistribution(group string, f SenderKeyFormat) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	key, rec, err := d.ownSenderKey(group)
	if err != nil {
		return nil, err
	}
	if !rec.signs() {
		var r [4]byte
		rand.Read(r[:])
		s := senderKeyState{ChainID: binary.BigEndian.Uint32(r[:]) & 0x7FFFFFFF}
		rand.Read(s.DistributionID[:])
		s.DistributionID[6] = s.DistributionID[6]&0x0F | 0x40 // a version 4 UUID
		s.DistributionID[8] = s.DistributionID[8]&0x3F | 0x80
		rand.Read(s.Chain.Key[:])
		sk := GenerateKeyPair()
		s.SigningPub, s.SigningPriv = sk.Public, &sk.Private
		rec.States = []senderKeyState{s}
		if err := d.save(key, rec); err != nil {
			return nil, err
		}
	}
	s := rec.States[0]
	return SenderKeyDistributionMessage{DistributionID: s.DistributionID, ChainID: s.ChainID,
		Iteration: s.Chain.Index, ChainKey: s.Chain.Key, SigningKey: s.SigningPub}.Encode(f), nil
}

// ownSenderKey loads this device's own sender key record for group, and
// the store key it is kept under; d.mu is held.
func (d *Device) ownSenderKey(group string) (string, senderKeyRecord, error) {
	key := senderKeyKey(group, d.self)
	var rec senderKeyRecord
	_, err := d.load(key, &rec)
	return key, rec, err
}

// signs reports whether the record holds a sender key this device can
// send with (its own, with the signing private key).
func (r *senderKeyRecord) signs() bool {
	return len(r.States) > 0 && r.States[0].SigningPriv != nil
}

// RotateGroup forgets this device's sender key for group: the next
// GroupDistribution makes a new one. Call it when a member leaves or is
// removed, and send the new distribution to the remaining members only.
func (d *Device) RotateGroup(group string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.st.Delete(senderKeyKey(group, d.self))
}

// GroupEncrypt seals plaintext once for every member holding this device's
// sender key (GroupDistribution must have been called).
func (d *Device) GroupEncrypt(group string, plain []byte, f SenderKeyFormat) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	key, rec, err := d.ownSenderKey(group)
	if err != nil {
		return nil, err
	}
	if !rec.signs() {
		return nil, fmt.Errorf("%w: own sender key for %q (send a distribution first)", ErrNoSenderKey, group)
	}
	s := &rec.States[0]
	iv, ck := groupMessageKey(s.Chain.messageSeed())
	ct := aesCBCEncrypt(ck, iv, plain)
	out := encodeSenderKeyMessage(f, s.DistributionID, s.ChainID, s.Chain.Index, ct, *s.SigningPriv)
	s.Chain = s.Chain.next()
	return out, d.save(key, rec)
}

func groupMessageKey(seed [32]byte) (iv, key []byte) {
	okm := hkdfSHA256(seed[:], nil, labelGroup, 48)
	return okm[:16], okm[16:]
}

// ProcessGroupDistribution stores a sender's key for group, received over
// the pairwise session with sender.
func (d *Device) ProcessGroupDistribution(group string, sender Address, msg []byte, f SenderKeyFormat) error {
	skdm, err := ParseSenderKeyDistributionMessage(msg, f)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	key := senderKeyKey(group, sender)
	var rec senderKeyRecord
	if _, err := d.load(key, &rec); err != nil {
		return err
	}
	for _, s := range rec.States {
		if s.ChainID == skdm.ChainID && s.SigningPub == skdm.SigningKey {
			return nil // already known
		}
	}
	s := senderKeyState{DistributionID: skdm.DistributionID, ChainID: skdm.ChainID,
		Chain: chainKey{Key: skdm.ChainKey, Index: skdm.Iteration}, SigningPub: skdm.SigningKey}
	rec.States = append([]senderKeyState{s}, rec.States...)
	if len(rec.States) > MaxSenderKeyStates {
		rec.States = rec.States[:MaxSenderKeyStates]
	}
	return d.save(key, rec)
}

// GroupDecrypt opens a group message of sender. A failure changes nothing.
func (d *Device) GroupDecrypt(group string, sender Address, msg []byte, f SenderKeyFormat) ([]byte, error) {
	m, err := ParseSenderKeyMessage(msg, f)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	key := senderKeyKey(group, sender)
	var rec senderKeyRecord
	if _, err := d.load(key, &rec); err != nil {
		return nil, err
	}
	var s *senderKeyState
	for i := range rec.States {
		st := &rec.States[i]
		if st.ChainID == m.ChainID && (f == FormatLegacy || st.DistributionID == m.DistributionID) {
			s = st
			break
		}
	}
	if s == nil {
		return nil, fmt.Errorf("%w: %s in %q, chain %d", ErrNoSenderKey, sender, group, m.ChainID)
	}
	if !m.verify(s.SigningPub) {
		return nil, fmt.Errorf("%w: group message", ErrBadSignature)
	}
	rc := receiverChain{Chain: s.Chain, Skipped: append([]skippedKey(nil), s.Skipped...)}
	seed, err := rc.messageSeed(m.Iteration)
	if err != nil {
		return nil, err
	}
	iv, ck := groupMessageKey(seed)
	plain, err := aesCBCDecrypt(ck, iv, m.Ciphertext)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecryptFailure, err)
	}
	s.Chain, s.Skipped = rc.Chain, rc.Skipped
	return plain, d.save(key, rec)
}
