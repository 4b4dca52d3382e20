// Package kt is Parley's key transparency: the pieces the server's log, the
// clients and outside auditors must agree on byte for byte. It owns the VRF
// that hides a user id behind a label (RFC 9381
// ECVRF-EDWARDS25519-SHA512-TAI), the canonical encoding of a log entry (a
// user's whole key-directory state after a change), the signed checkpoint
// (the C2SP tlog-checkpoint format, signed as a note), inclusion and
// consistency proofs on RFC 6962 Merkle trees, an in-memory Tree that
// answers them, a CompactRange a client keeps to rebuild roots from pages of
// leaves, and the Auditor that checks a whole log's history.
//
// It is pure computation: no I/O, no server imports. Values (Entry,
// Checkpoint, VRFPublicKey, VRFPrivateKey) are safe to share once built; a
// Tree is safe for concurrent use; an Auditor and a CompactRange are not
// (one goroutine owns each).
package kt
