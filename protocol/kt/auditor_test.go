package kt

import (
	"errors"
	"fmt"
	"testing"
)

// testLog builds well-formed entries: per label a version chain.
type testLog struct {
	last    map[[32]byte]labelState
	time    int64
	entries [][]byte
}

func newTestLog() *testLog { return &testLog{last: map[[32]byte]labelState{}} }

func (l *testLog) add(user string, devices int) Entry {
	var label [32]byte
	copy(label[:], user)
	prev := l.last[label]
	e := Entry{Label: label, Version: prev.version + 1, Prev: prev.hash, Time: l.time, Account: key(5, 33)}
	for i := range devices {
		e.Devices = append(e.Devices, EntryDevice{ID: fmt.Sprintf("d%02d", i), IdentityKey: key(byte(i), 33), Sig: key(9, 64)})
	}
	b := e.Marshal()
	l.last[label] = labelState{version: e.Version, hash: EntryHash(b)}
	l.time++
	l.entries = append(l.entries, b)
	return e
}

func (l *testLog) checkpoint(size int) Checkpoint {
	t := NewTree()
	for _, b := range l.entries[:size] {
		t.Append(b)
	}
	return Checkpoint{Origin: "test", Size: uint64(size), Root: t.Root()}
}

func sampleLog() *testLog {
	l := newTestLog()
	for i := range 40 {
		l.add(fmt.Sprintf("user%d", i%7), 1+i%3)
	}
	return l
}

func TestAuditorAcceptsAGoodLog(t *testing.T) {
	l := sampleLog()
	a := NewAuditor()
	if err := a.Feed(l.entries[:25]); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(l.checkpoint(20)); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(l.checkpoint(25)); err != nil {
		t.Fatal(err)
	}
	if err := a.Feed(l.entries[25:]); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(l.checkpoint(40)); err != nil {
		t.Fatal(err)
	}
	if a.Size() != 40 || a.Labels() != 7 {
		t.Fatalf("size %d labels %d", a.Size(), a.Labels())
	}
	if err := a.Check(l.checkpoint(30)); !errors.Is(err, ErrRollback) {
		t.Fatalf("an older checkpoint after a newer: %v, want ErrRollback", err)
	}
}

func TestAuditorCatches(t *testing.T) {
	mutate := func(f func(l *testLog)) [][]byte {
		l := sampleLog()
		f(l)
		return l.entries
	}
	cases := []struct {
		name    string
		entries [][]byte
	}{
		{"version gap", mutate(func(l *testLog) {
			var label [32]byte
			copy(label[:], "user3")
			s := l.last[label]
			l.last[label] = labelState{version: s.version + 1, hash: s.hash}
			l.add("user3", 1)
		})},
		{"first version 2", mutate(func(l *testLog) {
			var label [32]byte
			copy(label[:], "newcomer")
			l.last[label] = labelState{version: 1, hash: [32]byte{1}}
			l.add("newcomer", 1)
		})},
		{"bad prev", mutate(func(l *testLog) {
			var label [32]byte
			copy(label[:], "user2")
			s := l.last[label]
			s.hash[0] ^= 1
			l.last[label] = s
			l.add("user2", 2)
		})},
		{"time back", mutate(func(l *testLog) {
			l.time -= 5
			l.add("user1", 1)
		})},
		{"undecodable leaf", mutate(func(l *testLog) {
			l.entries[17] = append(l.entries[17], 0)
		})},
		{"a label's version replayed", mutate(func(l *testLog) {
			l.entries = append(l.entries, l.entries[3])
		})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := NewAuditor()
			err := a.Feed(c.entries)
			if !errors.Is(err, ErrAudit) {
				t.Fatalf("Feed: %v, want ErrAudit", err)
			}
			if err2 := a.Feed(nil); err2 == nil {
				t.Fatal("the auditor went on after an error")
			}
		})
	}
}

// The server rewrites an old leaf (a ghost device slipped into a past
// entry) and publishes the rewritten log: the leaves no longer give the
// checkpoint an earlier audit accepted.
func TestAuditorCatchesARewrittenLeaf(t *testing.T) {
	l := sampleLog()
	accepted := l.checkpoint(30)

	rewritten := sampleLog()
	e, err := UnmarshalEntry(rewritten.entries[12])
	if err != nil {
		t.Fatal(err)
	}
	e.Devices = append(e.Devices, EntryDevice{ID: "zz-ghost", IdentityKey: key(0xee, 33)})
	rewritten.entries[12] = e.Marshal()
	// Rechain the label's later entries so the rewritten log is well formed.
	rechain(t, rewritten.entries, 12)

	a := NewAuditor()
	a.Resume(accepted)
	if err := a.Feed(rewritten.entries); err != nil {
		t.Fatalf("the rechained log is well formed: %v", err)
	}
	if err := a.Check(rewritten.checkpoint(40)); !errors.Is(err, ErrFork) {
		t.Fatalf("Check: %v, want ErrFork", err)
	}

	// Without rechaining, Feed itself sees the broken chain.
	broken := sampleLog()
	broken.entries[12] = e.Marshal()
	if !followedByItsLabel(t, broken.entries, 12) {
		t.Fatal("the sample log has no later entry for the label of leaf 12: the case tests nothing")
	}
	if err := NewAuditor().Feed(broken.entries); !errors.Is(err, ErrAudit) {
		t.Fatalf("Feed of a rewritten leaf: %v, want ErrAudit", err)
	}
	// And a fresh auditor's root check refuses the old checkpoint.
	b := NewAuditor()
	if err := b.Feed(rewritten.entries); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(accepted); !errors.Is(err, ErrAudit) {
		t.Fatalf("Check of the accepted checkpoint against the rewritten leaves: %v, want ErrAudit", err)
	}
}

func rechain(t *testing.T, entries [][]byte, from int) {
	t.Helper()
	hashes := map[[32]byte][32]byte{}
	for i, b := range entries {
		e, err := UnmarshalEntry(b)
		if err != nil {
			t.Fatal(err)
		}
		if i > from && e.Version > 1 {
			e.Prev = hashes[e.Label]
			b = e.Marshal()
			entries[i] = b
		}
		hashes[e.Label] = EntryHash(b)
	}
}

func followedByItsLabel(t *testing.T, entries [][]byte, i int) bool {
	e, _ := UnmarshalEntry(entries[i])
	for _, b := range entries[i+1:] {
		if o, _ := UnmarshalEntry(b); o.Label == e.Label {
			return true
		}
	}
	return false
}

func TestAuditorCheckRefuses(t *testing.T) {
	l := sampleLog()
	a := NewAuditor()
	if err := a.Feed(l.entries[:10]); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(l.checkpoint(11)); !errors.Is(err, ErrAudit) {
		t.Fatalf("checkpoint past the fed leaves: %v", err)
	}
	c := l.checkpoint(10)
	c.Root[3] ^= 1
	if err := a.Check(c); !errors.Is(err, ErrAudit) {
		t.Fatalf("a root the leaves do not give: %v", err)
	}
	if err := a.Check(l.checkpoint(10)); err != nil {
		t.Fatal(err)
	}
	o := l.checkpoint(10)
	o.Origin = "other"
	if err := a.Check(o); !errors.Is(err, ErrAudit) {
		t.Fatalf("another origin: %v", err)
	}
}
