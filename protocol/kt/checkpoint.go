package kt

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// Checkpoint is a signed tree head: the log's origin (its name, the note
// key's name), its size and the RFC 6962 root of its first Size leaves.
type Checkpoint struct {
	Origin string
	Size   uint64
	Root   [32]byte
}

// ErrCheckpoint: a checkpoint's text is malformed, or its signature does
// not verify with the pinned key, or it names another origin.
var ErrCheckpoint = errors.New("kt: bad checkpoint")

// MaxCheckpointBytes bounds a signed checkpoint's text (a body of three
// lines and one signature line need under 300).
const MaxCheckpointBytes = 1024

// Body is c's note text in the C2SP tlog-checkpoint format: the origin, the
// size in decimal and the root in standard base64, one per line, with no
// extension lines.
func (c Checkpoint) Body() string {
	return c.Origin + "\n" + strconv.FormatUint(c.Size, 10) + "\n" +
		base64.StdEncoding.EncodeToString(c.Root[:]) + "\n"
}

// ParseCheckpoint reads a checkpoint body (Body's format, strictly: no
// extension lines, no leading zeros, a 32-byte root).
func ParseCheckpoint(body string) (Checkpoint, error) {
	lines := strings.Split(body, "\n")
	if len(lines) != 4 || lines[3] != "" {
		return Checkpoint{}, fmt.Errorf("%w: want three lines", ErrCheckpoint)
	}
	var c Checkpoint
	c.Origin = lines[0]
	if c.Origin == "" {
		return Checkpoint{}, fmt.Errorf("%w: empty origin", ErrCheckpoint)
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || strconv.FormatUint(size, 10) != lines[1] {
		return Checkpoint{}, fmt.Errorf("%w: size %q", ErrCheckpoint, lines[1])
	}
	c.Size = size
	root, err := base64.StdEncoding.Strict().DecodeString(lines[2])
	if err != nil || len(root) != 32 {
		return Checkpoint{}, fmt.Errorf("%w: root %q", ErrCheckpoint, lines[2])
	}
	copy(c.Root[:], root)
	return c, nil
}

// SignCheckpoint returns c as a signed note. The signer's name must be c's
// origin.
func SignCheckpoint(s note.Signer, c Checkpoint) ([]byte, error) {
	if s.Name() != c.Origin {
		return nil, fmt.Errorf("kt: sign checkpoint of origin %q with key %q", c.Origin, s.Name())
	}
	text, err := note.Sign(&note.Note{Text: c.Body()}, s)
	if err != nil {
		return nil, fmt.Errorf("kt: sign checkpoint: %w", err)
	}
	return text, nil
}

// OpenCheckpoint verifies a signed checkpoint with v and parses it; the
// checkpoint's origin must be v's name. Every failure is ErrCheckpoint.
func OpenCheckpoint(v note.Verifier, text []byte) (Checkpoint, error) {
	if len(text) > MaxCheckpointBytes {
		return Checkpoint{}, fmt.Errorf("%w: %d bytes", ErrCheckpoint, len(text))
	}
	n, err := note.Open(text, note.VerifierList(v))
	if err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %v", ErrCheckpoint, err)
	}
	c, err := ParseCheckpoint(n.Text)
	if err != nil {
		return Checkpoint{}, err
	}
	if c.Origin != v.Name() {
		return Checkpoint{}, fmt.Errorf("%w: origin %q, want %q", ErrCheckpoint, c.Origin, v.Name())
	}
	return c, nil
}

// GenerateKeys returns a fresh deployment's keys: an Ed25519 note signing
// key and its verifier key (note's text forms, named origin) and a VRF key.
func GenerateKeys(origin string) (noteSKey, noteVKey string, vrf *VRFPrivateKey, err error) {
	noteSKey, noteVKey, err = note.GenerateKey(rand.Reader, origin)
	if err != nil {
		return "", "", nil, fmt.Errorf("kt: note key: %w", err)
	}
	vrf, err = GenerateVRFKey()
	if err != nil {
		return "", "", nil, err
	}
	return noteSKey, noteVKey, vrf, nil
}
