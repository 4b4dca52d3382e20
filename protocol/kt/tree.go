package kt

import (
	"errors"
	"fmt"
	"sync"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
)

var hasher = rfc6962.DefaultHasher

// ErrProof: an inclusion proof does not verify.
var ErrProof = errors.New("kt: proof does not verify")

// ErrFork: two checkpoints of one origin cannot both be heads of one
// append-only log — same size with different roots, or no consistency
// proof between them verifies. The server showed a forked log.
var ErrFork = errors.New("kt: checkpoints are not consistent (forked log)")

// ErrRollback: a checkpoint is smaller than one already seen.
var ErrRollback = errors.New("kt: checkpoint older than one already seen (rolled-back log)")

// LeafHash is the RFC 6962 leaf hash of an entry encoding.
func LeafHash(entry []byte) [32]byte {
	var h [32]byte
	copy(h[:], hasher.HashLeaf(entry))
	return h
}

// EmptyRoot is the root of the empty log.
func EmptyRoot() [32]byte {
	var h [32]byte
	copy(h[:], hasher.EmptyRoot())
	return h
}

// VerifyInclusion checks that entry is leaf index of the log c heads.
// Any failure is ErrProof.
func VerifyInclusion(c Checkpoint, index uint64, entry []byte, p [][]byte) error {
	if index >= c.Size {
		return fmt.Errorf("%w: index %d in a log of %d", ErrProof, index, c.Size)
	}
	leaf := hasher.HashLeaf(entry)
	if err := proof.VerifyInclusion(hasher, index, c.Size, leaf, p, c.Root[:]); err != nil {
		return fmt.Errorf("%w: %v", ErrProof, err)
	}
	return nil
}

// VerifyConsistency checks that the log new heads extends the one old
// heads, with p the consistency proof from old.Size to new.Size. A smaller
// new is ErrRollback; any other failure is ErrFork.
func VerifyConsistency(old, new Checkpoint, p [][]byte) error {
	if old.Origin != new.Origin {
		return fmt.Errorf("%w: origins %q and %q", ErrFork, old.Origin, new.Origin)
	}
	switch {
	case new.Size < old.Size:
		return fmt.Errorf("%w: size %d after %d", ErrRollback, new.Size, old.Size)
	case old.Size == 0:
		if old.Root != EmptyRoot() {
			return fmt.Errorf("%w: empty log with a non-empty root", ErrFork)
		}
		return nil
	case old.Size == new.Size:
		if old.Root != new.Root || len(p) != 0 {
			return fmt.Errorf("%w: two roots for size %d", ErrFork, old.Size)
		}
		return nil
	}
	if err := proof.VerifyConsistency(hasher, old.Size, new.Size, p, old.Root[:], new.Root[:]); err != nil {
		return fmt.Errorf("%w: sizes %d to %d: %v", ErrFork, old.Size, new.Size, err)
	}
	return nil
}

// Tree is a log's Merkle tree with every node hash in memory (64 bytes a
// leaf): it appends entries and answers roots and proofs for any size up to
// its own. It is safe for concurrent use.
type Tree struct {
	mu sync.RWMutex
	// levels[l][i] is the hash of the perfect subtree of 2^l leaves
	// starting at leaf i<<l; len(levels[l]) == size>>l.
	levels [][][32]byte
}

// NewTree returns an empty tree.
func NewTree() *Tree { return &Tree{levels: [][][32]byte{nil}} }

// Append adds an entry encoding as the next leaf and returns its index.
func (t *Tree) Append(entry []byte) uint64 {
	return t.AppendHash(LeafHash(entry))
}

// AppendHash adds a leaf by its leaf hash (LeafHash) and returns its index.
func (t *Tree) AppendHash(leaf [32]byte) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	index := uint64(len(t.levels[0]))
	t.levels[0] = append(t.levels[0], leaf)
	h, i := leaf, index
	for l := 0; i&1 == 1; l++ {
		h = children(t.levels[l][i-1], h)
		i >>= 1
		if l+1 == len(t.levels) {
			t.levels = append(t.levels, nil)
		}
		t.levels[l+1] = append(t.levels[l+1], h)
	}
	return index
}

// Size is the number of leaves.
func (t *Tree) Size() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return uint64(len(t.levels[0]))
}

// Root is the root of the whole tree.
func (t *Tree) Root() [32]byte {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.rootAt(uint64(len(t.levels[0])))
}

// RootAt is the root of the tree's first size leaves.
func (t *Tree) RootAt(size uint64) ([32]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if size > uint64(len(t.levels[0])) {
		return [32]byte{}, fmt.Errorf("kt: root at %d of a tree of %d", size, len(t.levels[0]))
	}
	return t.rootAt(size), nil
}

// LeafHash returns the leaf hash at index.
func (t *Tree) LeafHash(index uint64) ([32]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if index >= uint64(len(t.levels[0])) {
		return [32]byte{}, fmt.Errorf("kt: leaf %d of a tree of %d", index, len(t.levels[0]))
	}
	return t.levels[0][index], nil
}

// InclusionProof is the proof that leaf index is in the tree of the first
// size leaves (index < size <= Size()).
func (t *Tree) InclusionProof(index, size uint64) ([][]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if size > uint64(len(t.levels[0])) || index >= size {
		return nil, fmt.Errorf("kt: inclusion of %d in %d, tree of %d", index, size, len(t.levels[0]))
	}
	nodes, err := proof.Inclusion(index, size)
	if err != nil {
		return nil, fmt.Errorf("kt: inclusion: %w", err)
	}
	return t.rehash(nodes)
}

// ConsistencyProof is the proof that the tree of the first to leaves
// extends the tree of the first from (from <= to <= Size()).
func (t *Tree) ConsistencyProof(from, to uint64) ([][]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if to > uint64(len(t.levels[0])) || from > to {
		return nil, fmt.Errorf("kt: consistency from %d to %d, tree of %d", from, to, len(t.levels[0]))
	}
	nodes, err := proof.Consistency(from, to)
	if err != nil {
		return nil, fmt.Errorf("kt: consistency: %w", err)
	}
	return t.rehash(nodes)
}

// rehash fetches the nodes of a proof and folds its ephemeral node; the
// caller holds mu.
func (t *Tree) rehash(nodes proof.Nodes) ([][]byte, error) {
	hashes := make([][]byte, len(nodes.IDs))
	for i, id := range nodes.IDs {
		if int(id.Level) >= len(t.levels) || id.Index >= uint64(len(t.levels[id.Level])) {
			return nil, fmt.Errorf("kt: proof node %d/%d missing", id.Level, id.Index)
		}
		h := t.levels[id.Level][id.Index] // a copy: callers never alias the tree
		hashes[i] = h[:]
	}
	out, err := nodes.Rehash(hashes, hasher.HashChildren)
	if err != nil {
		return nil, fmt.Errorf("kt: proof: %w", err)
	}
	return out, nil
}

// rootAt folds the perfect subtrees that make up the first size leaves,
// right to left; the caller holds mu.
func (t *Tree) rootAt(size uint64) [32]byte {
	if size == 0 {
		return EmptyRoot()
	}
	var root [32]byte
	first := true
	// The lowest set bit of size is the rightmost (smallest) subtree.
	for l := 0; l < 64; l++ {
		if size&(1<<l) == 0 {
			continue
		}
		node := t.levels[l][(size>>l)-1]
		if first {
			root, first = node, false
		} else {
			root = children(node, root)
		}
	}
	return root
}

func children(l, r [32]byte) [32]byte {
	var h [32]byte
	copy(h[:], hasher.HashChildren(l[:], r[:]))
	return h
}

// CompactRange is the compact Merkle range [0, Size()) of a log: the
// O(log n) subtree hashes a client keeps to rebuild the root from pages of
// leaves without holding the leaves. It is not safe for concurrent use.
type CompactRange struct {
	r *compact.Range
}

var rangeFactory = &compact.RangeFactory{Hash: hasher.HashChildren}

// NewCompactRange returns the range of the empty log.
func NewCompactRange() *CompactRange {
	return &CompactRange{r: rangeFactory.NewEmptyRange(0)}
}

// Append adds an entry encoding as the next leaf.
func (c *CompactRange) Append(entry []byte) {
	if err := c.r.Append(hasher.HashLeaf(entry), nil); err != nil {
		panic(err) // only a range not starting at 0 can fail
	}
}

// Size is the number of leaves appended.
func (c *CompactRange) Size() uint64 { return c.r.End() }

// Root is the root of the leaves appended.
func (c *CompactRange) Root() [32]byte {
	if c.r.End() == 0 {
		return EmptyRoot()
	}
	h, err := c.r.GetRootHash(nil)
	if err != nil {
		panic(err)
	}
	var root [32]byte
	copy(root[:], h)
	return root
}

// Marshal encodes the range: u64be size || the subtree hashes (32 bytes
// each, as many as the size's set bits).
func (c *CompactRange) Marshal() []byte {
	hashes := c.r.Hashes()
	b := make([]byte, 8, 8+32*len(hashes))
	size := c.r.End()
	for i := range 8 {
		b[i] = byte(size >> (56 - 8*i))
	}
	for _, h := range hashes {
		b = append(b, h...)
	}
	return b
}

// UnmarshalCompactRange decodes what Marshal wrote.
func UnmarshalCompactRange(b []byte) (*CompactRange, error) {
	if len(b) < 8 || (len(b)-8)%32 != 0 {
		return nil, errors.New("kt: bad compact range")
	}
	var size uint64
	for i := range 8 {
		size = size<<8 | uint64(b[i])
	}
	var hashes [][]byte
	for rest := b[8:]; len(rest) > 0; rest = rest[32:] {
		hashes = append(hashes, append([]byte(nil), rest[:32]...))
	}
	r, err := rangeFactory.NewRange(0, size, hashes)
	if err != nil {
		return nil, fmt.Errorf("kt: bad compact range: %w", err)
	}
	return &CompactRange{r: r}, nil
}
