// Package e2ee is Parley's end-to-end encryption for clients: Signal's
// protocol family written on the Go standard library (crypto/ecdh,
// crypto/mlkem, crypto/hkdf, crypto/hmac, crypto/aes) and
// filippo.io/edwards25519 (XEdDSA).
//
//   - PQXDH (X3DH plus a signed ML-KEM-1024 prekey) starts a session with a
//     device that may be offline, from a prekey bundle the server hands out.
//     A bundle without a KEM prekey, and a version 3 (classic X3DH) first
//     message for a new session, are refused with ErrDowngrade: the server
//     cannot strip the post-quantum part. Device.SetAllowX3DH opts in to
//     X3DH for peers without PQXDH; messages of an existing version 3
//     session are read either way.
//   - A first message that consumed no one-time prekey (signed prekey and
//     last-resort KEM key only, which outlive it) could be replayed once
//     its session is reset or archived away; the device remembers its
//     (signed prekey id, KEM prekey id, base key) in its Store and refuses
//     it again with ErrReusedBaseKey, as libsignal refuses a reused base
//     key. The memory is one Store entry (about 100 bytes) per such session,
//     kept as long as its signed prekey and KEM key: PruneRetiredKeys (and
//     PruneSignedPreKeys) drop the entries with the key, so it is bounded
//     by the sessions started without one-time keys during a key's life.
//   - The signed prekey and the last-resort KEM key are replaced on a
//     schedule (RotationDue, RotateSignedPreKey, RotateLastResortKEM); a
//     replaced key is kept for a grace period so that first messages in
//     flight to it open, then PruneRetiredKeys deletes it.
//   - The Double Ratchet then protects every message, with libsignal's
//     limits: MaxSkippedKeys (2,000) kept per receiving chain,
//     MaxForwardJump (25,000), errors beyond them (ErrTooFarAhead,
//     ErrDuplicate).
//   - Sender Keys encrypt a group message once (GroupEncrypt); the key is
//     distributed over the pairwise sessions and rotated (RotateGroup) when
//     a member leaves.
//   - SafetyNumber is libsignal's 60-digit displayable fingerprint.
//   - EncryptAttachment and DecryptAttachment are Signal's attachment
//     scheme (attachment.go): a fresh 64-byte key per file, padding to
//     size buckets (PaddedSize), IV ‖ AES-256-CBC ‖ HMAC-SHA256 and a
//     SHA-256 digest of the whole, streamed both ways; decryption checks
//     digest and MAC before it writes a byte of plaintext.
//
// Messages are byte-compatible with libsignal's SignalMessage,
// PreKeySignalMessage (with the PQXDH fields), SenderKeyMessage and
// SenderKeyDistributionMessage; the known-answer tests use libsignal's
// published vectors and an interoperability test (interop/libsignal) runs
// against go.mau.fi/libsignal. Not implemented: libsignal's SPQR ("triple
// ratchet") extension, sealed sender.
//
// Each Device has its own identity key (one identity per device): a message
// to a user is encrypted to each of their devices and to the sender's own
// other devices. A user's devices share an account key that certifies each
// device's identity key (account.go: CreateAccountKey, ExportAccountKey,
// ImportAccountKey, DeviceCertificate); AcceptDevices and AcceptDevice
// take a peer's device only if the account key trusted for its user
// certified it, and SafetyNumber is computed over account keys. State lives behind the Store interface; FileStore (files
// 0600 in a 0700 directory, each write fsynced with its directory, the
// directory locked so that a second process gets ErrLocked) is the default.
//
// Package client/e2eechat connects a Device to a Parley server: key
// upload, bundle fetches, the per-device envelopes of E2E conversations.
package e2ee
