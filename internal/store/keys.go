package store

import (
	"bytes"
	"context"
	"fmt"
)

// The E2E key directory: per device, the public keys other devices need to
// start a session with it while it is offline (an identity key, a signed
// prekey, one-time prekeys, signed ML-KEM prekeys: one-time ones and a last
// resort). The server stores them as opaque bytes; the chat layer checks
// their form and signatures before they get here.

// PreKey is one public prekey: its id, its serialized key and (signed
// prekeys, KEM prekeys) the identity key's signature over the key.
type PreKey struct {
	ID  uint32
	Key []byte
	Sig []byte
}

// DeviceKeys is a device's row of the directory.
type DeviceKeys struct {
	UserID         string
	DeviceID       string
	RegistrationID uint32
	IdentityKey    []byte
	// AccountKey is the user's account key and DeviceSig its signature
	// over the device certificate of IdentityKey (e2ekeys.DeviceCertMessage);
	// empty for a device uploaded before account keys.
	AccountKey    []byte
	DeviceSig     []byte
	SignedPreKey  PreKey
	LastResortKEM PreKey
	UpdatedAt     int64 // unix ms
}

// KeyUpload is one upload. The first upload of a device needs every
// single-valued field; later ones may carry only what changes.
type KeyUpload struct {
	RegistrationID uint32
	// IdentityKey different from the stored one replaces the device's
	// identity: its stored prekeys (signed by the old key) are dropped.
	IdentityKey []byte
	// AccountKey and DeviceSig, when set, replace the stored ones.
	AccountKey    []byte
	DeviceSig     []byte
	SignedPreKey  *PreKey
	LastResortKEM *PreKey
	PreKeys       []PreKey // one-time Curve25519 prekeys (an id already stored is replaced)
	KEMPreKeys    []PreKey // one-time ML-KEM prekeys
	Now           int64
}

// Apply returns the device's row after the upload, given the row as stored
// (found false: none yet), and says whether it creates the device or
// replaces its identity key (the engine then drops the device's stored
// one-time prekeys). A first upload without an identity key, a signed
// prekey and a last-resort KEM key fails with ErrNotFound. Every engine's
// UploadKeys decides the row here; the prekeys are the engine's own.
func (up KeyUpload) Apply(user, device string, cur DeviceKeys, found bool) (next DeviceKeys, newDevice, identityChanged bool, err error) {
	if !found {
		if up.IdentityKey == nil || up.SignedPreKey == nil || up.LastResortKEM == nil {
			return DeviceKeys{}, false, false, fmt.Errorf("first upload without identity key, signed prekey and last-resort KEM key: %w", ErrNotFound)
		}
		cur, newDevice = DeviceKeys{UserID: user, DeviceID: device}, true
	}
	if up.IdentityKey != nil {
		identityChanged = found && !bytes.Equal(up.IdentityKey, cur.IdentityKey)
		cur.IdentityKey = up.IdentityKey
	}
	if up.AccountKey != nil {
		cur.AccountKey = up.AccountKey
	}
	if up.DeviceSig != nil {
		cur.DeviceSig = up.DeviceSig
	}
	if up.RegistrationID != 0 {
		cur.RegistrationID = up.RegistrationID
	}
	if up.SignedPreKey != nil {
		cur.SignedPreKey = *up.SignedPreKey
	}
	if up.LastResortKEM != nil {
		cur.LastResortKEM = *up.LastResortKEM
	}
	cur.UpdatedAt = up.Now
	return cur, newDevice, identityChanged, nil
}

// UploadResult says what an upload changed.
type UploadResult struct {
	NewDevice       bool
	IdentityChanged bool
	Device          DeviceKeys
	PreKeys         int // one-time prekeys now stored
	KEMPreKeys      int
}

// KeyBundle is what a fetch hands out: the device's row plus at most one
// one-time prekey of each kind, each removed from the directory by this
// fetch. KEMPreKey is the last-resort key when no one-time KEM key is left.
type KeyBundle struct {
	Device        DeviceKeys
	PreKey        *PreKey
	KEMPreKey     *PreKey
	KEMLastResort bool
	// Remaining one-time prekeys after the fetch.
	PreKeys    int
	KEMPreKeys int
}

// KeyDirectory is the key directory part of a Store.
type KeyDirectory interface {
	// UploadKeys stores a device's keys. A first upload without an
	// identity key, signed prekey and last-resort KEM key fails with
	// ErrNotFound (nothing to update).
	UploadKeys(ctx context.Context, user, device string, up KeyUpload) (UploadResult, error)
	// TakeBundle returns a device's bundle and removes the one-time keys it
	// hands out: each is handed out at most once, also under concurrent
	// calls (and, for Cassandra, from several processes). ErrNotFound if
	// the device has no keys.
	TakeBundle(ctx context.Context, user, device string) (KeyBundle, error)
	// KeyDevices lists the devices of a user that have keys, by device id.
	KeyDevices(ctx context.Context, user string) ([]DeviceKeys, error)
	// PreKeyCounts returns how many one-time prekeys of each kind a device
	// has left.
	PreKeyCounts(ctx context.Context, user, device string) (prekeys, kem int, err error)
	// RemoveDevice drops a device's keys and its push registrations (no
	// error if it has none).
	RemoveDevice(ctx context.Context, user, device string) error
}

// E2E is the end-to-end part of a Store.
type E2E interface {
	KeyDirectory
	// DirectE2E is Direct for the end-to-end encrypted 1:1 conversation of
	// a and b: a pair has one plaintext and one E2E conversation, each
	// created on first use (the E2E one with Conversation.E2E set).
	DirectE2E(ctx context.Context, a, b string, newID uint64, now int64) (Conversation, error)
}
