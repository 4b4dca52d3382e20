package kt

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
)

// The reference below is RFC 6962 section 2.1 written out recursively,
// independent of the merkle library and of Tree: MTH, PATH and PROOF.

func refLeaf(d []byte) []byte {
	h := sha256.Sum256(append([]byte{0}, d...))
	return h[:]
}

func refNode(l, r []byte) []byte {
	h := sha256.Sum256(append(append([]byte{1}, l...), r...))
	return h[:]
}

// split is the largest power of two smaller than n (n > 1).
func split(n int) int {
	k := 1
	for k<<1 < n {
		k <<= 1
	}
	return k
}

func refMTH(d [][]byte) []byte {
	switch len(d) {
	case 0:
		h := sha256.Sum256(nil)
		return h[:]
	case 1:
		return refLeaf(d[0])
	}
	k := split(len(d))
	return refNode(refMTH(d[:k]), refMTH(d[k:]))
}

func refPath(m int, d [][]byte) [][]byte {
	if len(d) <= 1 {
		return nil
	}
	k := split(len(d))
	if m < k {
		return append(refPath(m, d[:k]), refMTH(d[k:]))
	}
	return append(refPath(m-k, d[k:]), refMTH(d[:k]))
}

func refSubProof(m int, d [][]byte, b bool) [][]byte {
	n := len(d)
	if m == n {
		if b {
			return nil
		}
		return [][]byte{refMTH(d)}
	}
	k := split(n)
	if m <= k {
		return append(refSubProof(m, d[:k], b), refMTH(d[k:]))
	}
	return append(refSubProof(m-k, d[k:], false), refMTH(d[:k]))
}

func refProof(m int, d [][]byte) [][]byte {
	if m == 0 || m == len(d) {
		return nil
	}
	return refSubProof(m, d, true)
}

func leaves(n int, tag string) [][]byte {
	d := make([][]byte, n)
	for i := range d {
		d[i] = []byte(fmt.Sprintf("%s leaf %d", tag, i))
	}
	return d
}

func equalProofs(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func checkpointOf(t *Tree, size uint64) Checkpoint {
	root, err := t.RootAt(size)
	if err != nil {
		panic(err)
	}
	return Checkpoint{Origin: "test", Size: size, Root: root}
}

func TestTreeAgainstReference(t *testing.T) {
	const n = 70
	d := leaves(n, "a")
	tree := NewTree()
	if empty := EmptyRoot(); tree.Root() != empty || !bytes.Equal(empty[:], refMTH(nil)) {
		t.Fatal("empty root")
	}
	for i, l := range d {
		if got := tree.Append(l); got != uint64(i) {
			t.Fatalf("Append returned %d, want %d", got, i)
		}
		if root := tree.Root(); !bytes.Equal(root[:], refMTH(d[:i+1])) {
			t.Fatalf("root of %d leaves differs from RFC 6962's MTH", i+1)
		}
	}
	cr := NewCompactRange()
	for size := 1; size <= n; size++ {
		cr.Append(d[size-1])
		c := checkpointOf(tree, uint64(size))
		if want := refMTH(d[:size]); !bytes.Equal(c.Root[:], want) {
			t.Fatalf("RootAt(%d) differs from MTH", size)
		}
		if got := cr.Root(); got != c.Root {
			t.Fatalf("compact range root at %d differs", size)
		}
		for i := 0; i < size; i++ {
			p, err := tree.InclusionProof(uint64(i), uint64(size))
			if err != nil {
				t.Fatal(err)
			}
			if want := refPath(i, d[:size]); !equalProofs(p, want) {
				t.Fatalf("inclusion proof of %d in %d differs from RFC 6962's PATH", i, size)
			}
			if err := VerifyInclusion(c, uint64(i), d[i], p); err != nil {
				t.Fatalf("inclusion of %d in %d: %v", i, size, err)
			}
		}
		for m := 0; m <= size; m++ {
			p, err := tree.ConsistencyProof(uint64(m), uint64(size))
			if err != nil {
				t.Fatal(err)
			}
			if want := refProof(m, d[:size]); !equalProofs(p, want) {
				t.Fatalf("consistency proof %d to %d differs from RFC 6962's PROOF", m, size)
			}
			if err := VerifyConsistency(checkpointOf(tree, uint64(m)), c, p); err != nil {
				t.Fatalf("consistency %d to %d: %v", m, size, err)
			}
		}
	}
	if _, err := tree.InclusionProof(n, n); err == nil {
		t.Fatal("inclusion proof of a leaf past the size")
	}
	if _, err := tree.ConsistencyProof(3, n+1); err == nil {
		t.Fatal("consistency proof past the tree")
	}
}

func TestTamperedProofsRefused(t *testing.T) {
	d := leaves(21, "a")
	tree := NewTree()
	for _, l := range d {
		tree.Append(l)
	}
	c := checkpointOf(tree, 21)
	incl, _ := tree.InclusionProof(5, 21)
	old := checkpointOf(tree, 13)
	cons, _ := tree.ConsistencyProof(13, 21)

	variants := func(p [][]byte) map[string][][]byte {
		v := map[string][][]byte{
			"dropped last": p[:len(p)-1],
			"extra node":   append(cloneProof(p), make([]byte, 32)),
			"reversed":     reversed(p),
		}
		for i := range p {
			q := cloneProof(p)
			q[i][7] ^= 0x20
			v[fmt.Sprintf("bit in node %d", i)] = q
		}
		return v
	}
	for name, p := range variants(incl) {
		if err := VerifyInclusion(c, 5, d[5], p); !errors.Is(err, ErrProof) {
			t.Errorf("inclusion, %s: %v, want ErrProof", name, err)
		}
	}
	for name, p := range variants(cons) {
		if err := VerifyConsistency(old, c, p); !errors.Is(err, ErrFork) {
			t.Errorf("consistency, %s: %v, want ErrFork", name, err)
		}
	}
	if err := VerifyInclusion(c, 6, d[5], incl); !errors.Is(err, ErrProof) {
		t.Errorf("inclusion at another index: %v", err)
	}
	if err := VerifyInclusion(c, 5, d[6], incl); !errors.Is(err, ErrProof) {
		t.Errorf("inclusion of another entry: %v", err)
	}
	if err := VerifyInclusion(c, 21, d[5], incl); !errors.Is(err, ErrProof) {
		t.Errorf("inclusion past the size: %v", err)
	}
	bad := c
	bad.Root[0] ^= 1
	if err := VerifyInclusion(bad, 5, d[5], incl); !errors.Is(err, ErrProof) {
		t.Errorf("inclusion under another root: %v", err)
	}
}

// A log that shows one history to one reader and another to a second:
// the second checkpoint cannot be proven to extend the first.
func TestForkedTreeRefused(t *testing.T) {
	a, b := NewTree(), NewTree()
	for i, l := range leaves(30, "x") {
		a.Append(l)
		if i == 9 {
			l = []byte("ghost device for bob")
		}
		b.Append(l)
	}
	oldA := checkpointOf(a, 12)
	newB := checkpointOf(b, 30)
	p, err := b.ConsistencyProof(12, 30)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyConsistency(oldA, newB, p); !errors.Is(err, ErrFork) {
		t.Fatalf("fork at leaf 9 through B's proof: %v, want ErrFork", err)
	}
	pa, _ := a.ConsistencyProof(12, 30)
	if err := VerifyConsistency(oldA, newB, pa); !errors.Is(err, ErrFork) {
		t.Fatalf("fork at leaf 9 through A's proof: %v, want ErrFork", err)
	}
	// Before the fork point both agree.
	early := checkpointOf(a, 9)
	pe, _ := b.ConsistencyProof(9, 30)
	if err := VerifyConsistency(early, newB, pe); err != nil {
		t.Fatalf("the common prefix: %v", err)
	}
	if err := VerifyConsistency(checkpointOf(a, 30), newB, nil); !errors.Is(err, ErrFork) {
		t.Fatalf("same size, two roots: %v, want ErrFork", err)
	}
	if err := VerifyConsistency(newB, oldA, nil); !errors.Is(err, ErrRollback) {
		t.Fatalf("a smaller checkpoint: %v, want ErrRollback", err)
	}
	other := newB
	other.Origin = "other"
	if err := VerifyConsistency(checkpointOf(b, 30), other, nil); !errors.Is(err, ErrFork) {
		t.Fatalf("another origin: %v, want ErrFork", err)
	}
}

func TestCompactRangeMarshal(t *testing.T) {
	cr := NewCompactRange()
	for i, l := range leaves(37, "c") {
		cr.Append(l)
		got, err := UnmarshalCompactRange(cr.Marshal())
		if err != nil {
			t.Fatal(err)
		}
		if got.Size() != uint64(i+1) || got.Root() != cr.Root() {
			t.Fatalf("size %d: round trip differs", i+1)
		}
	}
	b := cr.Marshal()
	for _, bad := range [][]byte{nil, b[:7], b[:len(b)-32], append(bytes.Clone(b), make([]byte, 32)...)} {
		if _, err := UnmarshalCompactRange(bad); err == nil {
			t.Errorf("UnmarshalCompactRange(%d bytes) accepted", len(bad))
		}
	}
}

func cloneProof(p [][]byte) [][]byte {
	q := make([][]byte, len(p))
	for i := range p {
		q[i] = bytes.Clone(p[i])
	}
	return q
}

func reversed(p [][]byte) [][]byte {
	q := cloneProof(p)
	for i, j := 0, len(q)-1; i < j; i, j = i+1, j-1 {
		q[i], q[j] = q[j], q[i]
	}
	return q
}

func TestTreeConcurrent(t *testing.T) {
	tree := NewTree()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 500; i++ {
			size := tree.Size()
			if size == 0 {
				continue
			}
			c := checkpointOf(tree, size)
			p, err := tree.InclusionProof(size-1, size)
			if err != nil {
				t.Error(err)
				return
			}
			if err := VerifyInclusion(c, size-1, []byte(fmt.Sprint(size-1)), p); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < 500; i++ {
		tree.Append([]byte(fmt.Sprint(i)))
	}
	<-done
}

// FuzzUnmarshalCompactRange: the decoder of a client's stored range never
// panics, and what it accepts re-encodes to the same bytes.
func FuzzUnmarshalCompactRange(f *testing.F) {
	cr := NewCompactRange()
	for _, l := range leaves(11, "f") {
		cr.Append(l)
	}
	f.Add(cr.Marshal())
	f.Add(NewCompactRange().Marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := UnmarshalCompactRange(b)
		if err != nil {
			return
		}
		if got := r.Marshal(); !bytes.Equal(got, b) {
			t.Fatalf("accepted %x, re-encodes to %x", b, got)
		}
		_ = r.Root()
	})
}
