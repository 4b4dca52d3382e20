package protocol

// Key transparency frames (docs/protocol.md, "Key transparency"): every
// change of the key directory is a leaf of an append-only Merkle log whose
// signed checkpoints, inclusion and consistency proofs let clients and
// outside auditors check that the server shows everyone the same keys. The
// encodings inside (entries, checkpoints, proofs) are protocol/kt's.

// Client frames of the key transparency log.
const (
	TypeKTKeys        = "kt_keys"        // the log's public keys; the answer has the same type
	TypeKTConsistency = "kt_consistency" // a consistency proof between two sizes; answered by kt_proof
	TypeKTLeaves      = "kt_leaves"      // a page of leaves; the answer has the same type
)

// TypeKTProof answers kt_consistency.
const TypeKTProof = "kt_proof"

// MaxKTLeaves is the most leaves one kt_leaves answer carries, and its
// default page.
const MaxKTLeaves = 1000

// KTProof is the kt field: on bundles and devices answers, the asked
// user's latest log entry with its inclusion proof in the checkpoint; on
// kt_proof, a consistency proof; on kt_leaves, a page of entries. Bytes are
// standard base64 in JSON. Index and From are leaf indexes counted from 0
// (absent: 0); a user without an entry gets Checkpoint, Label and VRFProof
// only, so the client can check the server does not hide an entry.
type KTProof struct {
	// Checkpoint is the log's current signed checkpoint (C2SP
	// tlog-checkpoint text signed as a note).
	Checkpoint string `json:"checkpoint"`
	// Label and VRFProof: the asked user's VRF output (32 bytes) and its
	// proof (80 bytes), so a user's label can be checked but not guessed.
	Label    []byte `json:"label,omitempty"`
	VRFProof []byte `json:"vrf_proof,omitempty"`
	// Index, Entry and Proof: the user's latest entry (its leaf index and
	// encoding) and the inclusion proof of that leaf in Checkpoint.
	Index uint64   `json:"index,omitempty"`
	Entry []byte   `json:"entry,omitempty"`
	Proof [][]byte `json:"proof,omitempty"`
	// From and Entries: a kt_leaves page, the leaves From, From+1, …
	Entries [][]byte `json:"entries,omitempty"`
	From    uint64   `json:"from,omitempty"`
}

// KTKeys is the kt_keys answer: what a client pins to verify the log.
type KTKeys struct {
	Origin  string `json:"origin"`   // the checkpoint origin line
	NoteKey string `json:"note_key"` // the checkpoint verifier key (golang.org/x/mod/sumdb/note text)
	VRFKey  []byte `json:"vrf_key"`  // the VRF public key (32 bytes)
}

// validateKT checks the form of a key transparency request; the sizes are
// checked by the server against the log.
func validateKT(f *Frame) *Error {
	switch f.Type {
	case TypeKTKeys:
		return nil
	case TypeKTConsistency:
		if f.From == 0 || f.To < f.From {
			return Errorf(CodeInvalidArgument, "kt_consistency needs 0 < from <= to")
		}
		return nil
	case TypeKTLeaves:
		if f.Limit < 0 || f.Limit > MaxKTLeaves {
			return Errorf(CodeInvalidArgument, "limit must be 0..%d", MaxKTLeaves)
		}
		return nil
	}
	return Errorf(CodeUnknownType, "unknown frame type %q", f.Type)
}
