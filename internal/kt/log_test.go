package kt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
	pkt "github.com/parley-im/parley/protocol/kt"
)

func openStore(t testing.TB, dir string) store.Store {
	t.Helper()
	s, err := pebble.Open(context.Background(), pebble.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func openLog(t testing.TB, st store.Store) *Log {
	t.Helper()
	l, err := Open(context.Background(), "test.example/kt", Deps{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// directory is a user → devices map playing the key directory's part.
type directory struct {
	mu   sync.Mutex
	devs map[string][]store.DeviceKeys
}

func (d *directory) set(user string, devs ...store.DeviceKeys) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.devs == nil {
		d.devs = map[string][]store.DeviceKeys{}
	}
	d.devs[user] = devs
}

func (d *directory) get(user string) []store.DeviceKeys {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.devs[user]
}

func (d *directory) reader(user string) func(context.Context) ([]store.DeviceKeys, error) {
	return func(context.Context) ([]store.DeviceKeys, error) { return d.get(user), nil }
}

func (d *directory) ensure(t testing.TB, l *Log, user string) *protocol.KTProof {
	t.Helper()
	p, err := l.Ensure(context.Background(), user, d.get(user), d.reader(user))
	if err != nil {
		t.Fatalf("Ensure %s: %v", user, err)
	}
	return p
}

func device(id string, n byte) store.DeviceKeys {
	return store.DeviceKeys{DeviceID: id, IdentityKey: append([]byte{5}, bytes.Repeat([]byte{n}, 32)...),
		AccountKey: append([]byte{5}, bytes.Repeat([]byte{0xAA}, 32)...), DeviceSig: bytes.Repeat([]byte{n}, 64), UpdatedAt: int64(n)}
}

// verify checks p the way a client does and returns the checkpoint and
// the entry (ok false: none).
func verify(t testing.TB, l *Log, user string, p *protocol.KTProof) (pkt.Checkpoint, pkt.Entry, bool) {
	t.Helper()
	keys := l.Keys()
	v, err := note.NewVerifier(keys.NoteKey)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := pkt.OpenCheckpoint(v, []byte(p.Checkpoint))
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	var pub pkt.VRFPublicKey
	copy(pub[:], keys.VRFKey)
	label, err := pub.VerifyLabel(user, p.VRFProof)
	if err != nil || !bytes.Equal(label[:], p.Label) {
		t.Fatalf("label of %s: %v", user, err)
	}
	if len(p.Entry) == 0 {
		return cp, pkt.Entry{}, false
	}
	if err := pkt.VerifyInclusion(cp, p.Index, p.Entry, p.Proof); err != nil {
		t.Fatalf("inclusion of %s's entry: %v", user, err)
	}
	e, err := pkt.UnmarshalEntry(p.Entry)
	if err != nil || e.Label != label {
		t.Fatalf("entry of %s: %v", user, err)
	}
	return cp, e, true
}

func TestEnsureAppendsChangesOnly(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "db"))
	l := openLog(t, st)
	var d directory
	if _, _, ok := verify(t, l, "alice", d.ensure(t, l, "alice")); ok {
		t.Fatal("a user with no device has an entry")
	}
	if l.Size() != 0 {
		t.Fatalf("size %d after a user without devices", l.Size())
	}
	d.set("alice", device("phone", 1))
	_, e, ok := verify(t, l, "alice", d.ensure(t, l, "alice"))
	if !ok || e.Version != 1 || len(e.Devices) != 1 || e.Devices[0].ID != "phone" || !bytes.Equal(e.Account, device("phone", 1).AccountKey) {
		t.Fatalf("first entry %+v", e)
	}
	d.ensure(t, l, "alice")
	if l.Size() != 1 {
		t.Fatalf("an unchanged state appended again: size %d", l.Size())
	}
	d.set("alice", device("phone", 1), device("laptop", 2))
	_, e2, _ := verify(t, l, "alice", d.ensure(t, l, "alice"))
	if e2.Version != 2 || e2.Prev != pkt.EntryHash(e.Marshal()) || len(e2.Devices) != 2 || e2.Devices[0].ID != "laptop" {
		t.Fatalf("second entry %+v", e2)
	}
	d.set("alice")
	_, e3, _ := verify(t, l, "alice", d.ensure(t, l, "alice"))
	if e3.Version != 3 || len(e3.Devices) != 0 || len(e3.Account) != 0 {
		t.Fatalf("entry after the last device went %+v", e3)
	}
	d.ensure(t, l, "alice")
	if l.Size() != 3 {
		t.Fatalf("size %d, want 3", l.Size())
	}
}

// TestReopenKeepsKeysAndLog: a restart (or a second process) loads the
// same keys and rebuilds the same tree from the store.
func TestReopenKeepsKeysAndLog(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	st := openStore(t, dir)
	l := openLog(t, st)
	var d directory
	for i := range 50 {
		u := fmt.Sprintf("u%d", i)
		d.set(u, device("p", byte(i)))
		d.ensure(t, l, u)
	}
	before, _, _ := verify(t, l, "u1", d.ensure(t, l, "u1"))
	keys := l.Keys()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openStore(t, dir)
	l2, err := Open(context.Background(), "another.origin", Deps{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if l2.Keys().NoteKey != keys.NoteKey || !bytes.Equal(l2.Keys().VRFKey, keys.VRFKey) || l2.Keys().Origin != "test.example/kt" {
		t.Fatal("reopen made new keys")
	}
	after, _, _ := verify(t, l2, "u1", d.ensure(t, l2, "u1"))
	if after != before {
		t.Fatalf("reopened log heads %+v, want %+v", after, before)
	}
}

// TestHealsMissedAppend: a directory change whose append never happened
// (a crash between the two) is appended by the next answer about the user.
func TestHealsMissedAppend(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "db"))
	l := openLog(t, st)
	var d directory
	d.set("bob", device("phone", 1))
	d.ensure(t, l, "bob")
	d.set("bob", device("phone", 9)) // the identity changed, no append
	_, e, _ := verify(t, l, "bob", d.ensure(t, l, "bob"))
	if e.Version != 2 || !bytes.Equal(e.Devices[0].IdentityKey, device("phone", 9).IdentityKey) {
		t.Fatalf("healed entry %+v", e)
	}
}

// TestStaleReadAppendsNothingOlder: a caller holding a read of the
// directory older than the log's entry (another process changed the
// directory and appended meanwhile) reads again rather than appending the
// old state over the new one.
func TestStaleReadAppendsNothingOlder(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "db"))
	a, b := openLog(t, st), openLog(t, st)
	var d directory
	d.set("bob", device("phone", 1))
	old := d.get("bob")
	d.ensure(t, a, "bob")
	d.set("bob", device("phone", 1), device("tablet", 2))
	d.ensure(t, b, "bob")
	p, err := a.Ensure(context.Background(), "bob", old, d.reader("bob"))
	if err != nil {
		t.Fatal(err)
	}
	_, e, _ := verify(t, a, "bob", p)
	if e.Version != 2 || len(e.Devices) != 2 || a.Size() != 2 {
		t.Fatalf("after a stale read: entry %+v, size %d; want version 2 with both devices, size 2", e, a.Size())
	}
}

// TestTwoWritersOneLog: two logs on one store (two chat processes)
// appending at once keep one log: every change is in it once, the
// auditor accepts it, and both processes head it alike.
func TestTwoWritersOneLog(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "db"))
	logs := []*Log{openLog(t, st), openLog(t, st)}
	var d directory
	const users, changes = 20, 5
	var wg sync.WaitGroup
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("user%d", u)
			for c := range changes {
				devs := []store.DeviceKeys{device("d0", byte(c+1))}
				d.set(user, devs...)
				if _, err := logs[(u+c)%2].Ensure(context.Background(), user, devs, d.reader(user)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ctx := context.Background()
	p0, err := logs[0].Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := logs[1].Checkpoint(ctx)
	if p0.Checkpoint != p1.Checkpoint {
		t.Fatalf("two processes head the log differently:\n%s\n%s", p0.Checkpoint, p1.Checkpoint)
	}
	if n := logs[0].Size(); n != users*changes {
		t.Fatalf("size %d, want %d (one leaf per change)", n, users*changes)
	}
	audit(t, logs[0], p0.Checkpoint)
}

// audit runs the auditor over the whole log and checks checkpoint text.
func audit(t testing.TB, l *Log, text string) *pkt.Auditor {
	t.Helper()
	ctx := context.Background()
	a := pkt.NewAuditor()
	for {
		page, err := l.Leaves(ctx, a.Size(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Entries) == 0 {
			break
		}
		if err := a.Feed(page.Entries); err != nil {
			t.Fatal(err)
		}
	}
	v, _ := note.NewVerifier(l.Keys().NoteKey)
	cp, err := pkt.OpenCheckpoint(v, []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check(cp); err != nil {
		t.Fatalf("audit: %v", err)
	}
	return a
}

func TestConsistencyAndLeaves(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "db"))
	l := openLog(t, st)
	var d directory
	var heads []pkt.Checkpoint
	for i := range 40 {
		u := fmt.Sprintf("u%d", i%13)
		d.set(u, device("p", byte(i)))
		cp, _, _ := verify(t, l, u, d.ensure(t, l, u))
		heads = append(heads, cp)
	}
	ctx := context.Background()
	for _, pair := range [][2]int{{0, 39}, {3, 17}, {20, 20}, {38, 39}} {
		old, nw := heads[pair[0]], heads[pair[1]]
		p, err := l.Consistency(ctx, old.Size, nw.Size)
		if err != nil {
			t.Fatal(err)
		}
		if err := pkt.VerifyConsistency(old, nw, p.Proof); err != nil {
			t.Fatalf("%d→%d: %v", old.Size, nw.Size, err)
		}
	}
	for _, bad := range [][2]uint64{{0, 3}, {5, 4}, {3, 41}} {
		_, err := l.Consistency(ctx, bad[0], bad[1])
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeInvalidArgument {
			t.Errorf("consistency %v: %v, want invalid_argument", bad, err)
		}
	}
	page, err := l.Leaves(ctx, 35, 100)
	if err != nil || page.From != 35 || len(page.Entries) != 5 {
		t.Fatalf("leaves from 35: %+v, %v", page, err)
	}
	page, err = l.Leaves(ctx, 40, 0)
	if err != nil || len(page.Entries) != 0 {
		t.Fatalf("leaves at the end: %+v, %v", page, err)
	}
	var pe *protocol.Error
	if _, err := l.Leaves(ctx, 41, 0); !errors.As(err, &pe) || pe.Code != protocol.CodeInvalidArgument {
		t.Fatalf("leaves past the end: %v", err)
	}
	audit(t, l, page.Checkpoint)
}

// TestTimeNeverGoesBack: a process whose clock is behind the last leaf's
// writes that leaf's time, so the log's times never decrease.
func TestTimeNeverGoesBack(t *testing.T) {
	st := openStore(t, filepath.Join(t.TempDir(), "db"))
	ahead, err := Open(context.Background(), "o", Deps{Store: st, Now: func() time.Time { return time.UnixMilli(2_000_000) }})
	if err != nil {
		t.Fatal(err)
	}
	behind, err := Open(context.Background(), "o", Deps{Store: st, Now: func() time.Time { return time.UnixMilli(1_000_000) }})
	if err != nil {
		t.Fatal(err)
	}
	var d directory
	d.set("a", device("p", 1))
	d.ensure(t, ahead, "a")
	d.set("b", device("p", 2))
	_, e, _ := verify(t, behind, "b", d.ensure(t, behind, "b"))
	if e.Time != 2_000_000 {
		t.Fatalf("time %d, want 2000000", e.Time)
	}
}
