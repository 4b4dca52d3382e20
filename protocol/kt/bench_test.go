package kt

import (
	"fmt"
	"sync"
	"testing"
)

const benchLeaves = 100_000

var (
	benchOnce    sync.Once
	benchTree    *Tree
	benchEntries [][]byte
)

// benchLog is a 100,000-leaf log of realistic entries (two devices each).
func benchLog() (*Tree, [][]byte) {
	benchOnce.Do(func() {
		l := newTestLog()
		for i := range benchLeaves {
			l.add(fmt.Sprintf("user%d", i%20000), 2)
		}
		benchEntries = l.entries
		benchTree = NewTree()
		for _, b := range benchEntries {
			benchTree.Append(b)
		}
	})
	return benchTree, benchEntries
}

func BenchmarkVerifyInclusion100k(b *testing.B) {
	tree, entries := benchLog()
	c := checkpointOf(tree, benchLeaves)
	const index = 61_803
	p, err := tree.InclusionProof(index, benchLeaves)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := VerifyInclusion(c, index, entries[index], p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyConsistency100k(b *testing.B) {
	tree, _ := benchLog()
	old, c := checkpointOf(tree, 61_803), checkpointOf(tree, benchLeaves)
	p, err := tree.ConsistencyProof(old.Size, c.Size)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := VerifyConsistency(old, c, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVRFVerify(b *testing.B) {
	k, err := GenerateVRFKey()
	if err != nil {
		b.Fatal(err)
	}
	_, proof := LabelFor(k, "alice@example")
	pk := k.Public()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pk.VerifyLabel("alice@example", proof); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVRFProve(b *testing.B) {
	k, err := GenerateVRFKey()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		LabelFor(k, "alice@example")
	}
}

func BenchmarkInclusionProof100k(b *testing.B) {
	tree, _ := benchLog()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tree.InclusionProof(61_803, benchLeaves); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTreeAppend(b *testing.B) {
	_, entries := benchLog()
	t := NewTree()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		t.Append(entries[i%len(entries)])
		i++
	}
}

func BenchmarkUnmarshalEntry(b *testing.B) {
	_, entries := benchLog()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := UnmarshalEntry(entries[777]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAudit100k(b *testing.B) {
	tree, entries := benchLog()
	c := checkpointOf(tree, benchLeaves)
	b.ReportAllocs()
	for b.Loop() {
		a := NewAuditor()
		if err := a.Feed(entries); err != nil {
			b.Fatal(err)
		}
		if err := a.Check(c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpenCheckpoint(b *testing.B) {
	s, v := testNoteKeys(b, "parley.example/kt")
	tree, _ := benchLog()
	c := checkpointOf(tree, benchLeaves)
	c.Origin = "parley.example/kt"
	text, err := SignCheckpoint(s, c)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := OpenCheckpoint(v, text); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyAnswer is what a client checks for one bundles or devices
// answer from a log of 100,000 changes: the checkpoint's signature, the
// VRF label, the inclusion proof and the entry's decoding.
func BenchmarkVerifyAnswer100k(b *testing.B) {
	s, v := testNoteKeys(b, "parley.example/kt")
	vrf, err := GenerateVRFKey()
	if err != nil {
		b.Fatal(err)
	}
	tree, entries := benchLog()
	c := checkpointOf(tree, benchLeaves)
	c.Origin = "parley.example/kt"
	text, err := SignCheckpoint(s, c)
	if err != nil {
		b.Fatal(err)
	}
	const index = 61_803
	p, err := tree.InclusionProof(index, benchLeaves)
	if err != nil {
		b.Fatal(err)
	}
	_, vproof := LabelFor(vrf, "alice@example")
	pk := vrf.Public()
	b.ReportAllocs()
	for b.Loop() {
		cp, err := OpenCheckpoint(v, text)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pk.VerifyLabel("alice@example", vproof); err != nil {
			b.Fatal(err)
		}
		if err := VerifyInclusion(cp, index, entries[index], p); err != nil {
			b.Fatal(err)
		}
		if _, err := UnmarshalEntry(entries[index]); err != nil {
			b.Fatal(err)
		}
	}
}
