package e2ee

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Address names one device of one user. User and device ids are Parley ids
// ([A-Za-z0-9._@-]), so "/" separates them safely in store keys.
type Address struct {
	User   string
	Device string
}

func (a Address) String() string { return a.User + "/" + a.Device }

// PublicPreKey is a one-time Curve25519 prekey as uploaded.
type PublicPreKey struct {
	ID  uint32
	Key PublicKey
}

// SignedPreKey is a Curve25519 prekey signed by the identity key.
type SignedPreKey struct {
	ID  uint32
	Key PublicKey
	Sig []byte // XEdDSA over Key.Bytes()
}

// KEMPreKey is an ML-KEM-1024 prekey signed by the identity key.
type KEMPreKey struct {
	ID  uint32
	Key []byte // KEMType || encapsulation key
	Sig []byte // XEdDSA over Key
}

// KeyUpload is what a device publishes to the key directory.
type KeyUpload struct {
	RegistrationID uint32
	IdentityKey    PublicKey
	SignedPreKey   *SignedPreKey
	PreKeys        []PublicPreKey
	KEMPreKeys     []KEMPreKey
	LastResortKEM  *KEMPreKey
}

// Bundle is what the key directory hands out for one device: at most one
// one-time prekey of each kind, used once.
type Bundle struct {
	Address
	RegistrationID uint32
	IdentityKey    PublicKey
	SignedPreKey   SignedPreKey
	PreKey         *PublicPreKey // nil when the device ran out
	KEMPreKey      *KEMPreKey    // nil: classic X3DH (version 3)
}

// VerifyBundle checks a bundle's signatures against its identity key.
func VerifyBundle(b Bundle) error {
	if !b.IdentityKey.Verify(b.SignedPreKey.Key.Bytes(), b.SignedPreKey.Sig) {
		return fmt.Errorf("%w: signed prekey signature does not verify", ErrBadSignature)
	}
	if b.KEMPreKey != nil && !b.IdentityKey.Verify(b.KEMPreKey.Key, b.KEMPreKey.Sig) {
		return fmt.Errorf("%w: KEM prekey signature does not verify", ErrBadSignature)
	}
	return nil
}

type identityRecord struct {
	Key   KeyPair `json:"key"`
	RegID uint32  `json:"reg"`
}

type metaRecord struct {
	NextPreKey    uint32 `json:"next_pk"`
	NextSigned    uint32 `json:"next_spk"`
	NextKEM       uint32 `json:"next_kem"`
	Signed        uint32 `json:"spk"`
	LastResort    uint32 `json:"last_resort"`
	HasSigned     bool   `json:"has_spk"`
	HasLastResort bool   `json:"has_last_resort"`
	// When the current signed prekey and last-resort KEM key were made
	// (unix ms; 0: before ages were recorded, so due for rotation).
	SignedAt     int64 `json:"spk_at,omitempty"`
	LastResortAt int64 `json:"last_resort_at,omitempty"`
	// Replaced keys kept for first messages still in flight to them,
	// until PruneRetiredKeys deletes them.
	Retired []retiredKey `json:"retired,omitempty"`
}

// retiredKey is a replaced signed prekey or last-resort KEM key.
type retiredKey struct {
	Signed bool   `json:"spk,omitempty"` // else a last-resort KEM key
	ID     uint32 `json:"id"`
	At     int64  `json:"at"` // unix ms of its replacement
}

type signedRecord struct {
	Key KeyPair `json:"key"`
	Sig []byte  `json:"sig"`
}

type kemRecord struct {
	Key        KEMKeyPair `json:"key"`
	Sig        []byte     `json:"sig"`
	LastResort bool       `json:"last_resort"`
}

type sessionRecord struct {
	Current  *sessionState  `json:"current,omitempty"`
	Previous []sessionState `json:"previous,omitempty"` // newest first
}

// Device is one device's end-to-end state: its identity, its prekeys, a
// session per peer device and the sender keys of its groups. It is safe for
// concurrent use; operations on it are serialised.
type Device struct {
	mu    sync.Mutex
	st    Store
	self  Address
	id    identityRecord
	trust TrustPolicy
	x3dh  bool             // classic X3DH allowed (SetAllowX3DH)
	now   func() time.Time // SetClock
}

// TrustPolicy decides what happens when a user's account key (AcceptDevices)
// or a peer device's identity key is not the one seen before.
type TrustPolicy uint8

const (
	// TrustOnFirstUse accepts a changed key (the new key replaces the old;
	// the safety number changes; AcceptDevices reports it). The default,
	// as in Signal.
	TrustOnFirstUse TrustPolicy = iota
	// TrustStrict refuses a changed key with ErrUntrusted (for an account
	// key an *UntrustedAccountError) until TrustAccount or TrustIdentity
	// accepts it.
	TrustStrict
)

// OpenDevice loads the device's state from st, creating an identity key
// and registration id on first use.
func OpenDevice(st Store, self Address) (*Device, error) {
	d := &Device{st: st, self: self, now: time.Now}
	ok, err := d.load("identity", &d.id)
	if err != nil {
		return nil, err
	}
	if !ok {
		var r [4]byte
		rand.Read(r[:])
		d.id = identityRecord{Key: GenerateKeyPair(), RegID: binary.BigEndian.Uint32(r[:])&0x3FFF + 1}
		if err := d.save("identity", d.id); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// SetTrustPolicy sets how identity changes of peers are handled.
func (d *Device) SetTrustPolicy(p TrustPolicy) { d.mu.Lock(); d.trust = p; d.mu.Unlock() }

// SetAllowX3DH lets the device start sessions from bundles without a KEM
// prekey and accept version 3 (classic X3DH) first messages, for peers that
// speak only X3DH (libsignal's older ports). Off by default: a server that
// strips the KEM prekey, or forges a version 3 first message, then gets a
// session without post-quantum protection instead of ErrDowngrade.
func (d *Device) SetAllowX3DH(allow bool) { d.mu.Lock(); d.x3dh = allow; d.mu.Unlock() }

// SetClock sets the clock the ages of the signed prekey and last-resort
// KEM key are read on (time.Now by default; tests and simulations).
func (d *Device) SetClock(now func() time.Time) { d.mu.Lock(); d.now = now; d.mu.Unlock() }

// Address is the device's own address.
func (d *Device) Address() Address { return d.self }

// IdentityKey is the device's public identity key.
func (d *Device) IdentityKey() PublicKey { return d.id.Key.Public }

// RegistrationID is the device's registration id (1..16384).
func (d *Device) RegistrationID() uint32 { return d.id.RegID }

func (d *Device) load(key string, v any) (bool, error) {
	b, err := d.st.Load(key)
	if err != nil || b == nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("e2ee: store entry %q: %w", key, err)
	}
	return true, nil
}

func (d *Device) save(key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return d.st.Save(key, b)
}

func idKey(prefix string, id uint32) string { return prefix + strconv.FormatUint(uint64(id), 10) }

// GenerateKeys makes n one-time Curve25519 prekeys and n one-time ML-KEM
// prekeys, plus a signed prekey and a last-resort KEM prekey if the device
// has none yet; it stores the private halves and returns what to upload.
func (d *Device) GenerateKeys(n int) (KeyUpload, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return KeyUpload{}, err
	}
	up := KeyUpload{RegistrationID: d.id.RegID, IdentityKey: d.id.Key.Public}
	if !m.HasSigned {
		spk, err := d.newSigned(&m)
		if err != nil {
			return up, err
		}
		up.SignedPreKey = &spk
	}
	if !m.HasLastResort {
		k, err := d.newKEM(&m, true)
		if err != nil {
			return up, err
		}
		up.LastResortKEM = &k
	}
	for i := 0; i < n; i++ {
		m.NextPreKey++
		kp := GenerateKeyPair()
		if err := d.save(idKey("prekey/", m.NextPreKey), kp); err != nil {
			return up, err
		}
		up.PreKeys = append(up.PreKeys, PublicPreKey{ID: m.NextPreKey, Key: kp.Public})
		k, err := d.newKEM(&m, false)
		if err != nil {
			return up, err
		}
		up.KEMPreKeys = append(up.KEMPreKeys, k)
	}
	return up, d.save("meta", m)
}

func (d *Device) newSigned(m *metaRecord) (SignedPreKey, error) {
	m.NextSigned++
	kp := GenerateKeyPair()
	sig := d.id.Key.Private.Sign(kp.Public.Bytes())
	if err := d.save(idKey("signed/", m.NextSigned), signedRecord{Key: kp, Sig: sig[:]}); err != nil {
		return SignedPreKey{}, err
	}
	m.Signed, m.HasSigned, m.SignedAt = m.NextSigned, true, d.now().UnixMilli()
	return SignedPreKey{ID: m.NextSigned, Key: kp.Public, Sig: sig[:]}, nil
}

func (d *Device) newKEM(m *metaRecord, lastResort bool) (KEMPreKey, error) {
	m.NextKEM++
	kp := GenerateKEMKeyPair()
	sig := d.id.Key.Private.Sign(kp.Public)
	if err := d.save(idKey("kem/", m.NextKEM), kemRecord{Key: kp, Sig: sig[:], LastResort: lastResort}); err != nil {
		return KEMPreKey{}, err
	}
	if lastResort {
		m.LastResort, m.HasLastResort, m.LastResortAt = m.NextKEM, true, d.now().UnixMilli()
	}
	return KEMPreKey{ID: m.NextKEM, Key: kp.Public, Sig: sig[:]}, nil
}

// RotateSignedPreKey makes a new signed prekey (to upload). The one it
// replaces is kept, so that first messages still in flight to it open,
// until PruneRetiredKeys (or PruneSignedPreKeys) drops it.
func (d *Device) RotateSignedPreKey() (SignedPreKey, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return SignedPreKey{}, err
	}
	old, had := m.Signed, m.HasSigned
	spk, err := d.newSigned(&m)
	if err != nil {
		return spk, err
	}
	if had {
		m.Retired = append(m.Retired, retiredKey{Signed: true, ID: old, At: m.SignedAt}) // m.SignedAt is now the replacement's
	}
	return spk, d.save("meta", m)
}

// RotateLastResortKEM makes a new last-resort KEM prekey (to upload as
// last_resort_kem). The one it replaces is kept until PruneRetiredKeys
// drops it, like a replaced signed prekey.
func (d *Device) RotateLastResortKEM() (KEMPreKey, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return KEMPreKey{}, err
	}
	old, had := m.LastResort, m.HasLastResort
	k, err := d.newKEM(&m, true)
	if err != nil {
		return k, err
	}
	if had {
		m.Retired = append(m.Retired, retiredKey{ID: old, At: m.LastResortAt}) // m.LastResortAt is now the replacement's
	}
	return k, d.save("meta", m)
}

// RotationDue reports whether the current signed prekey and the current
// last-resort KEM key are older than maxAge (keys of unknown age are). A
// device that has not made them yet (GenerateKeys does) has none due.
func (d *Device) RotationDue(maxAge time.Duration) (signed, lastResort bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return false, false, err
	}
	due := func(has bool, at int64) bool {
		return has && (at == 0 || d.now().Sub(time.UnixMilli(at)) >= maxAge)
	}
	return due(m.HasSigned, m.SignedAt), due(m.HasLastResort, m.LastResortAt), nil
}

// CurrentPreKeys returns the public halves of the current signed prekey
// and last-resort KEM key (what the directory should hand out), or
// ErrInvalidPreKey before GenerateKeys made them.
func (d *Device) CurrentPreKeys() (SignedPreKey, KEMPreKey, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return SignedPreKey{}, KEMPreKey{}, err
	}
	if !m.HasSigned || !m.HasLastResort {
		return SignedPreKey{}, KEMPreKey{}, fmt.Errorf("%w: no signed prekey or last-resort KEM key yet", ErrInvalidPreKey)
	}
	var spk signedRecord
	if ok, err := d.load(idKey("signed/", m.Signed), &spk); err != nil || !ok {
		return SignedPreKey{}, KEMPreKey{}, fmt.Errorf("%w: signed prekey %d (%v)", ErrInvalidPreKey, m.Signed, err)
	}
	var kem kemRecord
	if ok, err := d.load(idKey("kem/", m.LastResort), &kem); err != nil || !ok {
		return SignedPreKey{}, KEMPreKey{}, fmt.Errorf("%w: last-resort KEM key %d (%v)", ErrInvalidPreKey, m.LastResort, err)
	}
	return SignedPreKey{ID: m.Signed, Key: spk.Key.Public, Sig: spk.Sig},
		KEMPreKey{ID: m.LastResort, Key: kem.Key.Public, Sig: kem.Sig}, nil
}

// PruneRetiredKeys deletes the signed prekeys and last-resort KEM keys
// replaced more than grace ago, and the base keys remembered for them: a
// first message on a deleted key no longer opens, so a replay of it fails
// for want of the key (ErrInvalidPreKey) rather than by the memory.
func (d *Device) PruneRetiredKeys(grace time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return err
	}
	cutoff := d.now().Add(-grace).UnixMilli()
	kept := m.Retired[:0:0]
	pruned := false
	for _, r := range m.Retired {
		if r.At > cutoff {
			kept = append(kept, r)
			continue
		}
		pruned = true
		// The key goes first: its base keys are forgotten only once no
		// first message on it can open.
		if r.Signed {
			if err := d.st.Delete(idKey("signed/", r.ID)); err != nil {
				return err
			}
			if err := d.forgetBaseKeys(r.ID); err != nil {
				return err
			}
			continue
		}
		if err := d.st.Delete(idKey("kem/", r.ID)); err != nil {
			return err
		}
		if err := d.forgetKEMBaseKeys(r.ID); err != nil {
			return err
		}
	}
	if !pruned {
		return nil
	}
	m.Retired = kept
	return d.save("meta", m)
}

// PruneSignedPreKeys deletes all signed prekeys but the newest keep ones.
func (d *Device) PruneSignedPreKeys(keep int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return err
	}
	keys, err := d.st.List("signed/")
	if err != nil {
		return err
	}
	for _, k := range keys {
		id, err := strconv.ParseUint(strings.TrimPrefix(k, "signed/"), 10, 32)
		if err == nil && uint32(id)+uint32(keep) <= m.Signed {
			if err := d.st.Delete(k); err != nil {
				return err
			}
			if err := d.forgetBaseKeys(uint32(id)); err != nil {
				return err
			}
		}
	}
	return nil
}

// usedBaseKeyPrefix names the base keys of the sessions started without a
// one-time key: "basekey/<signed prekey id>/<KEM prekey id>/<base key>"
// (KEM id 0: classic X3DH).
const usedBaseKeyPrefix = "basekey/"

func usedBaseKey(spk, kem uint32, base PublicKey) string {
	return usedBaseKeyPrefix + strconv.FormatUint(uint64(spk), 10) + "/" +
		strconv.FormatUint(uint64(kem), 10) + "/" + hex.EncodeToString(base.Bytes())
}

// forgetBaseKeys drops the remembered base keys of a deleted signed prekey:
// a replay on it fails for want of the key.
func (d *Device) forgetBaseKeys(spk uint32) error {
	keys, err := d.st.List(usedBaseKeyPrefix + strconv.FormatUint(uint64(spk), 10) + "/")
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := d.st.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// forgetKEMBaseKeys drops the remembered base keys of a deleted
// last-resort KEM key, under every signed prekey.
func (d *Device) forgetKEMBaseKeys(kem uint32) error {
	keys, err := d.st.List(usedBaseKeyPrefix)
	if err != nil {
		return err
	}
	id := strconv.FormatUint(uint64(kem), 10)
	for _, k := range keys {
		if parts := strings.Split(k, "/"); len(parts) == 4 && parts[2] == id {
			if err := d.st.Delete(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkTrust applies the trust policy to a peer's identity key and records
// it. It reports whether the key changed.
func (d *Device) checkTrust(peer Address, key PublicKey) (bool, error) {
	var known PublicKey
	ok, err := d.load("trust/"+peer.String(), &known)
	if err != nil {
		return false, err
	}
	if ok && known == key {
		return false, nil
	}
	if ok && d.trust == TrustStrict {
		return true, fmt.Errorf("%w: %s", ErrUntrusted, peer)
	}
	return ok, d.save("trust/"+peer.String(), key)
}

// TrustIdentity records key as peer's identity (after the user compared
// safety numbers).
func (d *Device) TrustIdentity(peer Address, key PublicKey) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.save("trust/"+peer.String(), key)
}

// PeerIdentity returns the identity key last seen for peer.
func (d *Device) PeerIdentity(peer Address) (PublicKey, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var k PublicKey
	ok, err := d.load("trust/"+peer.String(), &k)
	return k, ok, err
}

// ProcessBundle starts a session with the bundle's device (PQXDH). A bad
// signature is refused, and so is a bundle without a KEM prekey
// (ErrDowngrade) unless SetAllowX3DH allows classic X3DH. The session's
// first messages are PreKeySignalMessages until the peer answers.
func (d *Device) ProcessBundle(b Bundle) error {
	if err := VerifyBundle(b); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if b.KEMPreKey == nil && !d.x3dh {
		return fmt.Errorf("%w: the bundle of %s has no KEM prekey", ErrDowngrade, b.Address)
	}
	if _, err := d.checkTrust(b.Address, b.IdentityKey); err != nil {
		return err
	}
	base := GenerateKeyPair()
	p := aliceParams{identity: d.id.Key, base: base, theirIdentity: b.IdentityKey,
		theirSignedPreKey: b.SignedPreKey.Key, theirRatchet: b.SignedPreKey.Key}
	pend := &pendingPreKey{SignedPreKeyID: b.SignedPreKey.ID, BaseKey: base.Public}
	if b.PreKey != nil {
		k := b.PreKey.Key
		p.theirOneTime = &k
		pend.PreKeyID, pend.HasPreKey = b.PreKey.ID, true
	}
	if b.KEMPreKey != nil {
		p.theirKEM = b.KEMPreKey.Key
		pend.KyberPreKeyID = b.KEMPreKey.ID
	}
	st, kct, err := aliceSession(p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadBundle, err)
	}
	pend.KyberCiphertext = kct
	st.Pending = pend
	st.LocalRegID, st.RemoteRegID = d.id.RegID, b.RegistrationID
	var rec sessionRecord
	if _, err := d.load("session/"+b.Address.String(), &rec); err != nil {
		return err
	}
	rec.promote(st)
	return d.save("session/"+b.Address.String(), rec)
}

func (r *sessionRecord) promote(s *sessionState) {
	if r.Current != nil {
		r.Previous = append([]sessionState{*r.Current}, r.Previous...)
		if len(r.Previous) > MaxArchivedStates {
			r.Previous = r.Previous[:MaxArchivedStates]
		}
	}
	r.Current = s
}

// HasSession reports whether the device has a session with peer.
func (d *Device) HasSession(peer Address) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var rec sessionRecord
	ok, err := d.load("session/"+peer.String(), &rec)
	return ok && rec.Current != nil, err
}

// SessionIdentity returns the identity key of peer's current session: who
// what Encrypt seals can be read by. ok is false without a session.
func (d *Device) SessionIdentity(peer Address) (PublicKey, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var rec struct {
		Current *struct {
			RemoteIdentity PublicKey `json:"rid"`
		} `json:"current"`
	}
	ok, err := d.load("session/"+peer.String(), &rec)
	if err != nil || !ok || rec.Current == nil {
		return PublicKey{}, false, err
	}
	return rec.Current.RemoteIdentity, true, nil
}

// Encrypt seals plaintext for peer on the current session.
func (d *Device) Encrypt(peer Address, plain []byte) (MessageType, []byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var rec sessionRecord
	ok, err := d.load("session/"+peer.String(), &rec)
	if err != nil {
		return 0, nil, err
	}
	if !ok || rec.Current == nil {
		return 0, nil, fmt.Errorf("%w: %s", ErrNoSession, peer)
	}
	t, ct := rec.Current.encrypt(plain)
	if err := d.save("session/"+peer.String(), rec); err != nil {
		return 0, nil, err
	}
	return t, ct, nil
}

// Decrypt opens a pairwise message from peer. A failed decryption changes
// nothing that is stored.
func (d *Device) Decrypt(peer Address, t MessageType, ct []byte) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch t {
	case TypeSignal:
		m, err := ParseSignalMessage(ct)
		if err != nil {
			return nil, err
		}
		var rec sessionRecord
		ok, err := d.load("session/"+peer.String(), &rec)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrNoSession, peer)
		}
		plain, err := rec.decrypt(m)
		if err != nil {
			return nil, err
		}
		return plain, d.save("session/"+peer.String(), rec)
	case TypePreKey:
		p, err := ParsePreKeySignalMessage(ct)
		if err != nil {
			return nil, err
		}
		return d.decryptPreKey(peer, p)
	}
	return nil, fmt.Errorf("%w: message type %d", ErrMalformed, t)
}

// decrypt tries the current session, then the archived ones (promoting
// the one that opens the message). The record changes only on success.
func (r *sessionRecord) decrypt(m SignalMessage) ([]byte, error) {
	var firstErr error
	if r.Current != nil {
		c := r.Current.clone()
		plain, err := c.decrypt(m)
		if err == nil {
			r.Current = c
			return plain, nil
		}
		firstErr = err
	}
	for i := range r.Previous {
		c := r.Previous[i].clone()
		plain, err := c.decrypt(m)
		if err != nil {
			continue
		}
		r.Previous = append(r.Previous[:i:i], r.Previous[i+1:]...)
		r.promote(c)
		return plain, nil
	}
	if firstErr == nil {
		firstErr = ErrNoSession
	}
	return nil, firstErr
}

func (d *Device) decryptPreKey(peer Address, p PreKeySignalMessage) ([]byte, error) {
	key := "session/" + peer.String()
	var rec sessionRecord
	if _, err := d.load(key, &rec); err != nil {
		return nil, err
	}
	// A session already built from this base key: a later PreKey message of
	// the same initiation (or a replay, refused as a duplicate).
	if rec.Current != nil && rec.Current.BaseKey == p.BaseKey && rec.Current.Version == p.Version {
		plain, err := rec.decrypt(p.Message)
		if err != nil {
			return nil, err
		}
		return plain, d.save(key, rec)
	}
	for i := range rec.Previous {
		if rec.Previous[i].BaseKey == p.BaseKey && rec.Previous[i].Version == p.Version {
			plain, err := rec.decrypt(p.Message)
			if err != nil {
				return nil, err
			}
			return plain, d.save(key, rec)
		}
	}
	// A new session: post-quantum only, and a base key never seen on keys
	// that are not consumed.
	if p.Version < VersionPQXDH && !d.x3dh {
		return nil, fmt.Errorf("%w: version %d first message from %s", ErrDowngrade, p.Version, peer)
	}
	var spk signedRecord
	ok, err := d.load(idKey("signed/", p.SignedPreKeyID), &spk)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: signed prekey %d", ErrInvalidPreKey, p.SignedPreKeyID)
	}
	bp := bobParams{identity: d.id.Key, signedPreKey: spk.Key, ratchet: spk.Key,
		theirIdentity: p.IdentityKey, theirBaseKey: p.BaseKey}
	if p.HasPreKey {
		var otk KeyPair
		ok, err := d.load(idKey("prekey/", p.PreKeyID), &otk)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: one-time prekey %d (used or unknown)", ErrInvalidPreKey, p.PreKeyID)
		}
		bp.oneTime = &otk
	}
	var kem kemRecord
	if p.Version >= VersionPQXDH {
		ok, err := d.load(idKey("kem/", p.KyberPreKeyID), &kem)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: KEM prekey %d (used or unknown)", ErrInvalidPreKey, p.KyberPreKeyID)
		}
		bp.kem, bp.kemCiphertext = &kem.Key, p.KyberCiphertext
	}
	// Without a one-time key consumed, only the remembered base key tells
	// a replay from a new session (the session may be reset or archived
	// out of reach).
	used := ""
	if !p.HasPreKey && (p.Version < VersionPQXDH || kem.LastResort) {
		var kemID uint32
		if p.Version >= VersionPQXDH {
			kemID = p.KyberPreKeyID
		}
		used = usedBaseKey(p.SignedPreKeyID, kemID, p.BaseKey)
		if b, err := d.st.Load(used); err != nil {
			return nil, err
		} else if b != nil {
			return nil, fmt.Errorf("%w: from %s on signed prekey %d", ErrReusedBaseKey, peer, p.SignedPreKeyID)
		}
	}
	st, err := bobSession(bp)
	if err != nil {
		return nil, err
	}
	st.LocalRegID, st.RemoteRegID = d.id.RegID, p.RegistrationID
	plain, err := st.decrypt(p.Message)
	if err != nil {
		return nil, err
	}
	// The message opened: only now trust, store and consume the keys.
	if _, err := d.checkTrust(peer, p.IdentityKey); err != nil {
		return nil, err
	}
	// Remembered before the session is stored: a crash in between loses
	// the message rather than letting it be replayed.
	if used != "" {
		if err := d.st.Save(used, []byte{1}); err != nil {
			return nil, err
		}
	}
	rec.promote(st)
	if err := d.save(key, rec); err != nil {
		return nil, err
	}
	if p.HasPreKey {
		if err := d.st.Delete(idKey("prekey/", p.PreKeyID)); err != nil {
			return nil, err
		}
	}
	if p.Version >= VersionPQXDH && !kem.LastResort {
		if err := d.st.Delete(idKey("kem/", p.KyberPreKeyID)); err != nil {
			return nil, err
		}
	}
	return plain, nil
}

// Reset forgets the session with peer (a new one starts from a bundle).
func (d *Device) Reset(peer Address) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.st.Delete("session/" + peer.String())
}
