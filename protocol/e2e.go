package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// End-to-end encryption frames (docs/protocol.md, "End-to-end encryption").

// Client frames of the key directory.
const (
	TypeKeysUpload  = "keys_upload"  // publish this device's keys
	TypeKeysBundle  = "keys_bundle"  // fetch a bundle of one device or of every device of a user
	TypeKeysDevices = "keys_devices" // list a user's devices with keys
	TypeKeysRemove  = "keys_remove"  // drop this device's keys
	// TypeConvInfo reads a conversation's conv frame (members included)
	// without changing it: what an E2E sender needs to know whom to
	// encrypt to.
	TypeConvInfo = "conv_info"
)

// Server frames of the key directory.
const (
	TypeKeys    = "keys"     // answer to keys_upload and keys_remove: this device's counts
	TypeBundles = "bundles"  // answer to keys_bundle
	TypeDevices = "devices"  // answer to keys_devices
	TypeKeysLow = "keys_low" // push: a device's one-time prekeys run low
)

// E2E error codes.
const (
	CodeE2ERequired    Code = "e2e_required"    // a body in an E2E conversation is not an E2E envelope
	CodeE2EUnsupported Code = "e2e_unsupported" // the feature needs plaintext on the server; not available in E2E conversations
	CodeBadKey         Code = "bad_key"         // a key of keys_upload is malformed or its signature does not verify
	// CodeAccountConflict: the upload's account key differs from the one
	// the user's other devices are certified by (link the device, or send
	// replace_account to start the account over).
	CodeAccountConflict Code = "account_conflict"
)

// Key directory limits.
const (
	MaxUploadPreKeys    = 100  // one-time Curve25519 prekeys per keys_upload
	MaxUploadKEMPreKeys = 20   // one-time ML-KEM prekeys per keys_upload
	MaxStoredPreKeys    = 1000 // one-time prekeys of each kind a device may hold
	MaxKeyDevices       = 32   // devices with keys per user
	KeysLowThreshold    = 10   // below this many one-time prekeys of a kind: keys_low
	MaxEnvelopeTo       = 200  // pairwise ciphertexts in one envelope
)

// Key sizes (libsignal's serializations).
const (
	CurveKeyBytes = 33   // 0x05 || X25519 public key
	KEMKeyBytes   = 1569 // 0x0A || ML-KEM-1024 encapsulation key
	SignatureSize = 64   // XEdDSA
)

// PreKey is a public prekey: id, key and (signed ones) the identity key's
// XEdDSA signature over the key. Bytes are standard base64 in JSON.
type PreKey struct {
	ID  uint32 `json:"id"`
	Key []byte `json:"key"`
	Sig []byte `json:"sig,omitempty"`
}

// KeyUpload is the keys field of keys_upload.
type KeyUpload struct {
	RegistrationID uint32 `json:"registration_id,omitempty"`
	IdentityKey    []byte `json:"identity_key,omitempty"`
	// AccountKey is the user's account key (33 bytes, 0x05 prefix), shared
	// by all the user's devices; DeviceSig is its signature over the
	// device certificate (e2ekeys.DeviceCertMessage) of this device's
	// identity key.
	AccountKey []byte `json:"account_key,omitempty"`
	DeviceSig  []byte `json:"device_sig,omitempty"`
	// ReplaceAccount: the account key replaces the one the user's other
	// devices are certified by, and those devices are removed.
	ReplaceAccount bool     `json:"replace_account,omitempty"`
	SignedPreKey   *PreKey  `json:"signed_prekey,omitempty"`
	LastResortKEM  *PreKey  `json:"last_resort_kem,omitempty"`
	PreKeys        []PreKey `json:"prekeys,omitempty"`
	KEMPreKeys     []PreKey `json:"kem_prekeys,omitempty"`
}

// KeyBundle is one device's bundle in a bundles answer.
type KeyBundle struct {
	UserID         string  `json:"user_id"`
	DeviceID       string  `json:"device_id"`
	RegistrationID uint32  `json:"registration_id"`
	IdentityKey    []byte  `json:"identity_key"`
	AccountKey     []byte  `json:"account_key,omitempty"`
	DeviceSig      []byte  `json:"device_sig,omitempty"`
	SignedPreKey   PreKey  `json:"signed_prekey"`
	PreKey         *PreKey `json:"prekey,omitempty"`
	KEMPreKey      *PreKey `json:"kem_prekey,omitempty"`
	KEMLastResort  bool    `json:"kem_last_resort,omitempty"`
	// Limited: the server withheld the one-time prekeys because the
	// requester or the device is past its hand-out bound (prekey is
	// absent, kem_prekey is the last-resort key); the session still starts.
	Limited bool `json:"limited,omitempty"`
}

// DeviceKeyInfo is one device in a devices answer.
type DeviceKeyInfo struct {
	DeviceID       string `json:"device_id"`
	RegistrationID uint32 `json:"registration_id"`
	IdentityKey    []byte `json:"identity_key"`
	AccountKey     []byte `json:"account_key,omitempty"`
	DeviceSig      []byte `json:"device_sig,omitempty"`
	UpdatedAt      int64  `json:"updated_at"`
}

// KeyCounts answers keys_upload and is pushed as keys_low.
type KeyCounts struct {
	PreKeys    int `json:"prekeys"`
	KEMPreKeys int `json:"kem_prekeys"`
}

// Envelope is the body of every message of an E2E conversation: pairwise
// ciphertexts for devices (libsignal SignalMessage, type 2, or
// PreKeySignalMessage, type 3) and/or one group ciphertext
// (SenderKeyMessage) for every member device.
type Envelope struct {
	E2E   int          `json:"e2e"`
	To    []EnvelopeTo `json:"to,omitempty"`
	Group []byte       `json:"group,omitempty"`
}

// EnvelopeTo is one device's pairwise ciphertext.
type EnvelopeTo struct {
	User   string `json:"user"`
	Device string `json:"device"`
	Type   int    `json:"type"`
	Body   []byte `json:"body"`
}

// ParseEnvelope checks that body is an E2E envelope: exactly the documented
// JSON shape (unknown fields refused, so no readable text rides along),
// version 1, at least one ciphertext.
func ParseEnvelope(body string) (*Envelope, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(body)))
	dec.DisallowUnknownFields()
	var e Envelope
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("not an E2E envelope: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("not an E2E envelope: trailing data")
	}
	if e.E2E != 1 {
		return nil, fmt.Errorf("E2E envelope version %d, want 1", e.E2E)
	}
	if len(e.To) == 0 && len(e.Group) == 0 {
		return nil, fmt.Errorf("E2E envelope without a ciphertext")
	}
	if len(e.To) > MaxEnvelopeTo {
		return nil, fmt.Errorf("E2E envelope with %d recipients, over %d", len(e.To), MaxEnvelopeTo)
	}
	for _, t := range e.To {
		if !ValidID(t.User) || !ValidID(t.Device) {
			return nil, fmt.Errorf("E2E envelope recipient %q/%q is not a valid user/device", t.User, t.Device)
		}
		if t.Type != 2 && t.Type != 3 {
			return nil, fmt.Errorf("E2E envelope ciphertext type %d, want 2 or 3", t.Type)
		}
		if len(t.Body) == 0 {
			return nil, fmt.Errorf("E2E envelope with an empty ciphertext")
		}
	}
	return &e, nil
}

// EncodeEnvelope is the body of e.
func EncodeEnvelope(e Envelope) string {
	e.E2E = 1
	b, _ := json.Marshal(e)
	return string(b)
}

func checkCurveKey(what string, k []byte) *Error {
	if len(k) != CurveKeyBytes || k[0] != 0x05 {
		return Errorf(CodeBadKey, "%s must be %d bytes starting with 0x05", what, CurveKeyBytes)
	}
	return nil
}

func checkSigned(what string, p *PreKey, size int, typ byte) *Error {
	if len(p.Key) != size || p.Key[0] != typ {
		return Errorf(CodeBadKey, "%s %d must be %d bytes starting with 0x%02x", what, p.ID, size, typ)
	}
	if len(p.Sig) != SignatureSize {
		return Errorf(CodeBadKey, "%s %d needs a %d-byte signature", what, p.ID, SignatureSize)
	}
	return nil
}

// validateKeys checks the form of a key frame; signatures are checked by
// the server against the identity key.
func validateKeys(f *Frame) *Error {
	switch f.Type {
	case TypeKeysUpload:
		k := f.Keys
		if k == nil {
			return Errorf(CodeInvalidArgument, "keys is required")
		}
		if len(k.PreKeys) > MaxUploadPreKeys || len(k.KEMPreKeys) > MaxUploadKEMPreKeys {
			return Errorf(CodeTooLarge, "at most %d prekeys and %d kem_prekeys per upload", MaxUploadPreKeys, MaxUploadKEMPreKeys)
		}
		if k.IdentityKey != nil {
			if e := checkCurveKey("identity_key", k.IdentityKey); e != nil {
				return e
			}
		}
		if k.AccountKey != nil {
			if e := checkCurveKey("account_key", k.AccountKey); e != nil {
				return e
			}
		}
		if k.DeviceSig != nil && len(k.DeviceSig) != SignatureSize {
			return Errorf(CodeBadKey, "device_sig must be %d bytes", SignatureSize)
		}
		if k.SignedPreKey != nil {
			if e := checkSigned("signed_prekey", k.SignedPreKey, CurveKeyBytes, 0x05); e != nil {
				return e
			}
		}
		if k.LastResortKEM != nil {
			if e := checkSigned("last_resort_kem", k.LastResortKEM, KEMKeyBytes, 0x0A); e != nil {
				return e
			}
		}
		for _, p := range k.PreKeys {
			if e := checkCurveKey(fmt.Sprintf("prekey %d", p.ID), p.Key); e != nil {
				return e
			}
		}
		for i := range k.KEMPreKeys {
			if e := checkSigned("kem_prekey", &k.KEMPreKeys[i], KEMKeyBytes, 0x0A); e != nil {
				return e
			}
		}
		return nil
	case TypeKeysBundle:
		if !ValidID(f.UserID) {
			return Errorf(CodeInvalidArgument, "user_id is not a valid user id")
		}
		if f.DeviceID != "" && !ValidID(f.DeviceID) {
			return Errorf(CodeInvalidArgument, "device_id is not a valid device id")
		}
		return nil
	case TypeKeysDevices:
		if !ValidID(f.UserID) {
			return Errorf(CodeInvalidArgument, "user_id is not a valid user id")
		}
		return nil
	case TypeKeysRemove:
		return nil
	}
	return Errorf(CodeUnknownType, "unknown frame type %q", f.Type)
}
