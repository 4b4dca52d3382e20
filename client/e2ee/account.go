package e2ee

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"

	"github.com/parley-im/parley/protocol/e2ekeys"
)

// Account keys and device certificates. A user (an account) has one
// account key, shared by all the user's devices; it signs a certificate
// for each device's identity key (e2ekeys.DeviceCertMessage). Trust is per
// user on the account key: a peer device is accepted only when its
// certificate verifies with the account key this device trusts for the
// user, so a device the server adds, or an identity key it substitutes,
// shows as a refused device or as a change of the user's account key —
// never as a silent new device. The per-device identity checks of
// ProcessBundle and Decrypt stay as libsignal has them; AcceptDevices
// records every certified identity where they look (TrustIdentity).

// Errors of account keys and certificates.
var (
	// ErrNoAccount: the device has no account key (CreateAccountKey or
	// ImportAccountKey first).
	ErrNoAccount = errors.New("e2ee: this device has no account key")
	// ErrBadCertificate: a device's certificate is missing or does not
	// verify with the account key trusted for its user.
	ErrBadCertificate = errors.New("e2ee: device certificate does not verify with the user's account key")
	// ErrVerifiedChanged: the account key of a user marked verified
	// changed; sending to them is refused until VerifyAccount.
	ErrVerifiedChanged = errors.New("e2ee: the account key of a verified user changed")
)

// UntrustedAccountError is TrustStrict's refusal of a user's new account
// key: the old key stays trusted and New waits for TrustAccount (or
// VerifyAccount). errors.Is(err, ErrUntrusted) holds.
type UntrustedAccountError struct {
	User     string
	Old, New PublicKey
}

func (e *UntrustedAccountError) Error() string {
	return fmt.Sprintf("e2ee: the account key of %s changed (refused under the strict trust policy until accepted)", e.User)
}

// Is makes errors.Is(err, ErrUntrusted) hold.
func (e *UntrustedAccountError) Is(target error) bool { return target == ErrUntrusted }

// accountKeyHeader opens an exported account key.
const accountKeyHeader = "parley-account-key-v1 "

// MarshalAccountKey is the export form of an account key pair: one line,
// "parley-account-key-v1 " then the private key in standard base64. It is
// the account's secret: whoever holds it can certify devices for the user.
func MarshalAccountKey(k KeyPair) []byte {
	return []byte(accountKeyHeader + base64.StdEncoding.EncodeToString(k.Private[:]) + "\n")
}

// ParseAccountKey reads MarshalAccountKey's form (a final newline
// optional) and derives the public key.
func ParseAccountKey(b []byte) (KeyPair, error) {
	b = bytes.TrimSuffix(b, []byte("\n"))
	rest, ok := bytes.CutPrefix(b, []byte(accountKeyHeader))
	if !ok {
		return KeyPair{}, fmt.Errorf("%w: not a parley account key", ErrBadKey)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(string(rest))
	if err != nil || len(raw) != 32 {
		return KeyPair{}, fmt.Errorf("%w: account key is not 32 bytes of base64", ErrBadKey)
	}
	var priv PrivateKey
	copy(priv[:], raw)
	kp := NewKeyPair(priv)
	if kp.Private != priv {
		return KeyPair{}, fmt.Errorf("%w: account key is not clamped", ErrBadKey)
	}
	return kp, nil
}

type ownAccount struct {
	Key KeyPair `json:"key"`
}

// peerAccount is what this device trusts for a user ("acct/<user>").
type peerAccount struct {
	Key      PublicKey `json:"key"`
	Verified bool      `json:"verified,omitempty"`
	// Blocked: the key changed while the user was verified; sending is
	// refused until VerifyAccount.
	Blocked bool `json:"blocked,omitempty"`
	// Pending: a new key refused under TrustStrict, waiting for
	// TrustAccount.
	Pending *PublicKey `json:"pending,omitempty"`
}

// certRecord is a peer device's identity as certified ("cert/<address>").
type certRecord struct {
	Identity PublicKey `json:"id"`
	Account  PublicKey `json:"acct"`
}

func accountKeyOf(user string) string { return "acct/" + user }

// AccountKey is the device's account key, if it has one.
func (d *Device) AccountKey() (PublicKey, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var a ownAccount
	ok, err := d.load("account", &a)
	return a.Key.Public, ok, err
}

// CreateAccountKey makes a new account key for the device's user,
// replacing any it had: what the first device of an account does (and a
// user who starts the account over; contacts see a new safety number).
func (d *Device) CreateAccountKey() (PublicKey, error) {
	kp := GenerateKeyPair()
	d.mu.Lock()
	defer d.mu.Unlock()
	return kp.Public, d.save("account", ownAccount{Key: kp})
}

// ExportAccountKey is the device's account key in MarshalAccountKey's
// form, to provision the user's other devices (ImportAccountKey).
func (d *Device) ExportAccountKey() ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var a ownAccount
	ok, err := d.load("account", &a)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrNoAccount
	}
	return MarshalAccountKey(a.Key), nil
}

// ImportAccountKey makes b (MarshalAccountKey's form) the device's account
// key, replacing any it had: linking a device to its user's account.
func (d *Device) ImportAccountKey(b []byte) (PublicKey, error) {
	kp, err := ParseAccountKey(b)
	if err != nil {
		return PublicKey{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return kp.Public, d.save("account", ownAccount{Key: kp})
}

// DeviceCertificate is the account key and its signature over this
// device's certificate (e2ekeys.DeviceCertMessage), what keys_upload
// carries as account_key and device_sig.
func (d *Device) DeviceCertificate() (PublicKey, []byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var a ownAccount
	ok, err := d.load("account", &a)
	if err != nil {
		return PublicKey{}, nil, err
	}
	if !ok {
		return PublicKey{}, nil, ErrNoAccount
	}
	sig := a.Key.Private.Sign(e2ekeys.DeviceCertMessage(d.self.User, d.self.Device, d.id.Key.Public.Bytes()))
	return a.Key.Public, sig[:], nil
}

// PublicKeys is the device's identity, current signed prekey and
// last-resort KEM key, without one-time keys: a complete first upload for
// a server that does not know the device (or refused its first upload).
func (d *Device) PublicKeys() (KeyUpload, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	up := KeyUpload{RegistrationID: d.id.RegID, IdentityKey: d.id.Key.Public}
	var m metaRecord
	if _, err := d.load("meta", &m); err != nil {
		return up, err
	}
	if m.HasSigned {
		var s signedRecord
		if ok, err := d.load(idKey("signed/", m.Signed), &s); err != nil || !ok {
			return up, fmt.Errorf("e2ee: signed prekey %d: missing (%v)", m.Signed, err)
		}
		up.SignedPreKey = &SignedPreKey{ID: m.Signed, Key: s.Key.Public, Sig: s.Sig}
	}
	if m.HasLastResort {
		var k kemRecord
		if ok, err := d.load(idKey("kem/", m.LastResort), &k); err != nil || !ok {
			return up, fmt.Errorf("e2ee: last-resort KEM prekey %d: missing (%v)", m.LastResort, err)
		}
		up.LastResortKEM = &KEMPreKey{ID: m.LastResort, Key: k.Key.Public, Sig: k.Sig}
	}
	return up, nil
}

// DeviceCert is a device as the key directory lists it: its identity key,
// the account key it claims and the certificate signature.
type DeviceCert struct {
	Address
	IdentityKey PublicKey
	AccountKey  []byte // serialized (33 bytes); empty for a device without one
	Sig         []byte
}

// Valid reports whether the certificate verifies with its own account key.
func (c DeviceCert) Valid() bool {
	return e2ekeys.VerifyDeviceCert(c.AccountKey, c.User, c.Device, c.IdentityKey.Bytes(), c.Sig)
}

// AccountChange reports that a user's account key is not the one trusted
// before.
type AccountChange struct {
	User     string
	Old, New PublicKey
	// WasVerified: the user was verified; sending to them is refused until
	// VerifyAccount.
	WasVerified bool
	// Accepted: New is trusted now (TrustOnFirstUse). False under
	// TrustStrict: Old stays trusted until TrustAccount.
	Accepted bool
}

// DeviceCheck is what AcceptDevices decided about a user's device list.
type DeviceCheck struct {
	Accepted []DeviceCert // certified by the user's trusted account key
	Refused  []DeviceCert // no certificate, a bad one, or another account key
	// Change: the list is certified by another account key than the one
	// trusted (under TrustStrict its devices are neither accepted nor
	// refused: they wait for TrustAccount).
	Change *AccountChange
}

// AccountTrust is what the device trusts for a user.
type AccountTrust struct {
	Key      PublicKey
	Verified bool
	Blocked  bool       // changed since verified: sending refused
	Pending  *PublicKey // refused under TrustStrict, waiting for TrustAccount
}

// AcceptDevices applies the trust policy to a user's device list as the
// server gave it. Devices whose certificate verifies with the user's
// trusted account key are accepted and their identity keys recorded
// (TrustIdentity), so that ProcessBundle and Decrypt take them; the others
// are refused. For the device's own user the trusted key is its own
// account key. For a peer seen for the first time, the account key of the
// certified devices is recorded (trust on first use). A list certified
// only by another single account key is a change: accepted and reported
// under TrustOnFirstUse (marking a verified user blocked), refused with an
// *UntrustedAccountError under TrustStrict. A list that mixes account keys
// none of which is trusted is refused whole.
func (d *Device) AcceptDevices(user string, certs []DeviceCert) (DeviceCheck, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out DeviceCheck
	byKey := map[PublicKey][]DeviceCert{}
	for _, c := range certs {
		ak, err := DecodePublicKey(c.AccountKey)
		if c.User != user || err != nil || !c.Valid() {
			out.Refused = append(out.Refused, c)
			continue
		}
		byKey[ak] = append(byKey[ak], c)
	}
	trusted, known, err := d.trustedAccount(user)
	if err != nil {
		return out, err
	}
	var rec peerAccount
	if user != d.self.User {
		if _, err := d.load(accountKeyOf(user), &rec); err != nil {
			return out, err
		}
	}
	use, ok := PublicKey{}, false
	switch {
	case known && byKey[trusted] != nil:
		use, ok = trusted, true
		if rec.Pending != nil { // the server shows the trusted key again
			rec.Pending = nil
			if err := d.save(accountKeyOf(user), rec); err != nil {
				return out, err
			}
		}
	case user == d.self.User || len(byKey) != 1:
		// Own devices are certified by the own account key or not at all;
		// several untrusted keys at once are no account.
	default:
		for k := range byKey {
			use = k
		}
		switch {
		case !known:
			rec, ok = peerAccount{Key: use}, true
		case d.trust == TrustStrict:
			out.Change = &AccountChange{User: user, Old: trusted, New: use, WasVerified: rec.Verified || rec.Blocked}
			if rec.Pending == nil || *rec.Pending != use {
				p := use
				rec.Pending = &p
				if err := d.save(accountKeyOf(user), rec); err != nil {
					return out, err
				}
			}
			// Change reports the waiting devices; they are not refused.
			return out, &UntrustedAccountError{User: user, Old: trusted, New: use}
		default:
			out.Change = &AccountChange{User: user, Old: trusted, New: use, WasVerified: rec.Verified || rec.Blocked, Accepted: true}
			rec, ok = peerAccount{Key: use, Blocked: out.Change.WasVerified}, true
		}
		if err := d.save(accountKeyOf(user), rec); err != nil {
			return out, err
		}
	}
	keys := make([]PublicKey, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return bytes.Compare(keys[i][:], keys[j][:]) < 0 })
	for _, k := range keys {
		if ok && k == use {
			for _, c := range byKey[k] {
				if err := d.recordCert(c, k); err != nil {
					return out, err
				}
				out.Accepted = append(out.Accepted, c)
			}
		} else {
			out.Refused = append(out.Refused, byKey[k]...)
		}
	}
	return out, nil
}

// AcceptDevice accepts one device (a bundle's) only if its certificate
// verifies with the account key already trusted for its user; it never
// changes that trust (AcceptDevices, on the whole list, does).
func (d *Device) AcceptDevice(c DeviceCert) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	trusted, known, err := d.trustedAccount(c.User)
	if err != nil {
		return err
	}
	if !known || !bytes.Equal(c.AccountKey, trusted.Bytes()) || !c.Valid() {
		return fmt.Errorf("%w: %s", ErrBadCertificate, c.Address)
	}
	return d.recordCert(c, trusted)
}

func (d *Device) recordCert(c DeviceCert, account PublicKey) error {
	key := "cert/" + c.Address.String()
	want := certRecord{Identity: c.IdentityKey, Account: account}
	var cur certRecord
	if ok, err := d.load(key, &cur); err != nil {
		return err
	} else if ok && cur == want {
		return nil
	}
	if err := d.save(key, want); err != nil {
		return err
	}
	return d.save("trust/"+c.Address.String(), c.IdentityKey)
}

// trustedAccount is the account key trusted for user: the device's own for
// its own user.
func (d *Device) trustedAccount(user string) (PublicKey, bool, error) {
	if user == d.self.User {
		var a ownAccount
		ok, err := d.load("account", &a)
		return a.Key.Public, ok, err
	}
	var rec peerAccount
	ok, err := d.load(accountKeyOf(user), &rec)
	return rec.Key, ok, err
}

// Certified reports whether identity is the key of peer certified by the
// account key trusted for peer's user (AcceptDevices, AcceptDevice).
func (d *Device) Certified(peer Address, identity PublicKey) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	trusted, known, err := d.trustedAccount(peer.User)
	if err != nil || !known {
		return false, err
	}
	var c certRecord
	ok, err := d.load("cert/"+peer.String(), &c)
	return ok && c.Identity == identity && c.Account == trusted, err
}

// PeerAccount is what the device trusts for user.
func (d *Device) PeerAccount(user string) (AccountTrust, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if user == d.self.User {
		k, ok, err := d.trustedAccount(user)
		return AccountTrust{Key: k, Verified: ok}, ok, err
	}
	var rec peerAccount
	ok, err := d.load(accountKeyOf(user), &rec)
	return AccountTrust{Key: rec.Key, Verified: rec.Verified, Blocked: rec.Blocked, Pending: rec.Pending}, ok, err
}

// MaySend reports whether messages may be encrypted to user: not while a
// verified user's changed key is not verified again (ErrVerifiedChanged),
// nor while a new key waits for TrustAccount under TrustStrict
// (*UntrustedAccountError).
func (d *Device) MaySend(user string) error {
	if user == d.self.User {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var rec peerAccount
	if _, err := d.load(accountKeyOf(user), &rec); err != nil {
		return err
	}
	if rec.Pending != nil {
		return &UntrustedAccountError{User: user, Old: rec.Key, New: *rec.Pending}
	}
	if rec.Blocked {
		return fmt.Errorf("%w: %s (compare the new safety number, then verify again)", ErrVerifiedChanged, user)
	}
	return nil
}

// TrustAccount accepts the account key waiting under TrustStrict for user
// (the user compared safety numbers, or chose to go on). A user who was
// verified stays blocked until VerifyAccount.
func (d *Device) TrustAccount(user string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var rec peerAccount
	if ok, err := d.load(accountKeyOf(user), &rec); err != nil || !ok || rec.Pending == nil {
		return err
	}
	rec = peerAccount{Key: *rec.Pending, Blocked: rec.Verified || rec.Blocked}
	return d.save(accountKeyOf(user), rec)
}

// VerifyAccount marks user's account key verified (the user compared the
// safety number out of band): the newest key seen, a pending one
// included. A later change blocks sending until VerifyAccount again. It
// returns the key marked.
func (d *Device) VerifyAccount(user string) (PublicKey, error) {
	if user == d.self.User {
		return PublicKey{}, errors.New("e2ee: cannot verify one's own account")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var rec peerAccount
	ok, err := d.load(accountKeyOf(user), &rec)
	if err != nil {
		return PublicKey{}, err
	}
	if !ok {
		return PublicKey{}, fmt.Errorf("e2ee: no account key seen for %s yet", user)
	}
	if rec.Pending != nil {
		rec.Key = *rec.Pending
	}
	rec = peerAccount{Key: rec.Key, Verified: true}
	return rec.Key, d.save(accountKeyOf(user), rec)
}
