package kt

import (
	"errors"
	"fmt"
)

// ErrAudit: the log's leaves break its rules (an entry that does not
// decode, a version gap, a Prev that is not the hash of the label's
// previous entry, time going back) or do not give a checkpoint's root.
var ErrAudit = errors.New("kt: audit failed")

// Auditor checks a whole log from its first leaf: every entry decodes,
// each label's versions count 1, 2, 3… with Prev the hash of the label's
// previous entry, times never go back, and the leaves give the root of
// every checkpoint checked, each extending the one before. After an error
// the Auditor refuses everything (its state is no longer the log's). It is
// not safe for concurrent use.
type Auditor struct {
	tree     *Tree
	labels   map[[32]byte]labelState
	lastTime int64
	last     Checkpoint
	checked  bool
	err      error
}

type labelState struct {
	version uint64
	hash    [32]byte
}

// NewAuditor returns an auditor of an empty log.
func NewAuditor() *Auditor {
	return &Auditor{tree: NewTree(), labels: map[[32]byte]labelState{}}
}

// Resume makes c the checkpoint the next Check must extend: the last one a
// previous audit of this log accepted (kept in a state file). Call it
// before the first Check; Check then also verifies that the fed leaves give
// c's root.
func (a *Auditor) Resume(c Checkpoint) {
	a.last, a.checked = c, true
}

// Size is the number of leaves fed.
func (a *Auditor) Size() uint64 { return a.tree.Size() }

// Labels is the number of distinct labels fed.
func (a *Auditor) Labels() int { return len(a.labels) }

// Last returns the last checkpoint checked (or resumed from).
func (a *Auditor) Last() (Checkpoint, bool) { return a.last, a.checked }

// Tree is the tree of the leaves fed (read it, do not append to it).
func (a *Auditor) Tree() *Tree { return a.tree }

// Feed checks and appends the next leaves of the log, in order.
func (a *Auditor) Feed(entries [][]byte) error {
	if a.err != nil {
		return a.err
	}
	for _, b := range entries {
		if err := a.feed(b); err != nil {
			a.err = err
			return err
		}
	}
	return nil
}

func (a *Auditor) feed(b []byte) error {
	index := a.tree.Size()
	e, err := UnmarshalEntry(b)
	if err != nil {
		return fmt.Errorf("%w: leaf %d: %v", ErrAudit, index, err)
	}
	prev := a.labels[e.Label]
	if e.Version != prev.version+1 {
		return fmt.Errorf("%w: leaf %d: label %x version %d after %d", ErrAudit, index, e.Label[:8], e.Version, prev.version)
	}
	if e.Prev != prev.hash {
		return fmt.Errorf("%w: leaf %d: label %x version %d: prev is not the hash of version %d", ErrAudit, index, e.Label[:8], e.Version, prev.version)
	}
	if e.Time < a.lastTime {
		return fmt.Errorf("%w: leaf %d: time %d before %d", ErrAudit, index, e.Time, a.lastTime)
	}
	a.labels[e.Label] = labelState{version: e.Version, hash: EntryHash(b)}
	a.lastTime = e.Time
	a.tree.Append(b)
	return nil
}

// Check verifies that the leaves fed give c's root (c.Size at most the
// number fed) and that c extends the previous checkpoint checked: the
// leaves give its root too, and it is not larger. A smaller checkpoint is
// ErrRollback, another origin or a root the leaves do not give ErrAudit
// (for the previous checkpoint, ErrFork).
func (a *Auditor) Check(c Checkpoint) error {
	if a.err != nil {
		return a.err
	}
	if a.checked && c.Origin != a.last.Origin {
		return fmt.Errorf("%w: origin %q after %q", ErrAudit, c.Origin, a.last.Origin)
	}
	if c.Size > a.tree.Size() {
		return fmt.Errorf("%w: checkpoint of %d leaves, %d fed", ErrAudit, c.Size, a.tree.Size())
	}
	root, _ := a.tree.RootAt(c.Size)
	if root != c.Root {
		return fmt.Errorf("%w: the %d leaves do not give the checkpoint's root", ErrAudit, c.Size)
	}
	if a.checked {
		if c.Size < a.last.Size {
			return fmt.Errorf("%w: size %d after %d", ErrRollback, c.Size, a.last.Size)
		}
		if prev, _ := a.tree.RootAt(a.last.Size); prev != a.last.Root {
			return fmt.Errorf("%w: the first %d leaves do not give the root of the checkpoint seen before", ErrFork, a.last.Size)
		}
	}
	a.last, a.checked = c, true
	return nil
}
