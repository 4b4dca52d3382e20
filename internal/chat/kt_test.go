package chat

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/bus/local"
	"github.com/parley-im/parley/internal/kt"
	"github.com/parley-im/parley/internal/registry/memory"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
	pkt "github.com/parley-im/parley/protocol/kt"
)

// failingAppends is a store whose log appends fail while failing is set
// (a crash between the directory write and the append).
type failingAppends struct {
	store.Store
	failing atomic.Bool
}

func (f *failingAppends) KTAppend(ctx context.Context, index uint64, leaf []byte) error {
	if f.failing.Load() {
		return errors.New("injected: the process died before the append")
	}
	return f.Store.KTAppend(ctx, index, leaf)
}

// ktEntry checks the kt of an answer about user and returns its entry.
func ktEntry(t *testing.T, l *kt.Log, user string, p *protocol.KTProof) pkt.Entry {
	t.Helper()
	if p == nil || len(p.Entry) == 0 {
		t.Fatalf("answer about %s without an entry: %+v", user, p)
	}
	v, _ := note.NewVerifier(l.Keys().NoteKey)
	cp, err := pkt.OpenCheckpoint(v, []byte(p.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	var pub pkt.VRFPublicKey
	copy(pub[:], l.Keys().VRFKey)
	if label, err := pub.VerifyLabel(user, p.VRFProof); err != nil || !bytes.Equal(label[:], p.Label) {
		t.Fatalf("label: %v", err)
	}
	if err := pkt.VerifyInclusion(cp, p.Index, p.Entry, p.Proof); err != nil {
		t.Fatal(err)
	}
	e, err := pkt.UnmarshalEntry(p.Entry)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestKTAnswersAndHealing: every directory change is an entry carrying
// the account key and each device's certificate; an append lost after the
// directory write (the upload still succeeds) is made by the next answer
// about the user, before it is given; replace_account leaves an entry of
// the new account's device alone.
func TestKTAnswersAndHealing(t *testing.T) {
	r := newPrekeyRig(t)
	st := &failingAppends{Store: r.st}
	l, err := kt.Open(context.Background(), "test", kt.Deps{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	s := newService(t, DefaultConfig(), st, memory.New(), local.New(), r.led, 1)
	s.kt = l
	a1, a2 := e2ee.GenerateKeyPair(), e2ee.GenerateKeyPair()
	phone, laptop := Caller{User: "alice", Device: "phone"}, Caller{User: "alice", Device: "laptop"}
	bob := Caller{User: "bob", Device: "b"}
	k := firstUpload(t, phone, &a1)
	if got := upload(t, s, phone, k); got.Type != protocol.TypeKeys {
		t.Fatalf("upload: %s %s", got.Code, got.Error)
	}
	if l.Size() != 1 {
		t.Fatalf("log of %d leaves after the first device", l.Size())
	}
	call(t, s, bob, &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "alice"})
	got := call(t, s, bob, &protocol.Frame{Type: protocol.TypeKeysDevices, UserID: "alice"})
	e := ktEntry(t, l, "alice", got.KT)
	if !bytes.Equal(e.Account, a1.Public.Bytes()) || len(e.Devices) != 1 || !bytes.Equal(e.Devices[0].Sig, k.DeviceSig) ||
		!bytes.Equal(e.Devices[0].IdentityKey, got.Devices[0].IdentityKey) {
		t.Fatalf("entry %+v for the answer %+v", e, got.Devices)
	}

	st.failing.Store(true)
	if got := upload(t, s, laptop, firstUpload(t, laptop, &a1)); got.Type != protocol.TypeKeys {
		t.Fatalf("an upload whose append failed: %s %s (the directory write is done)", got.Code, got.Error)
	}
	if l.Size() != 1 {
		t.Fatalf("log of %d leaves after a failed append", l.Size())
	}
	if got := call(t, s, bob, &protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "alice"}); got.Code != protocol.CodeStoreUnavailable {
		t.Fatalf("an answer that cannot prove its devices: %s %s, want store_unavailable", got.Type, got.Code)
	}
	st.failing.Store(false)
	got = call(t, s, bob, &protocol.Frame{Type: protocol.TypeKeysBundle, UserID: "alice"})
	if e := ktEntry(t, l, "alice", got.KT); e.Version != 2 || len(got.Bundles) != 2 || len(e.Devices) != 2 {
		t.Fatalf("healed entry version %d with %d devices, answer of %d bundles", e.Version, len(e.Devices), len(got.Bundles))
	}
	for _, b := range got.Bundles {
		if d, ok := ktEntry(t, l, "alice", got.KT).Device(b.DeviceID); !ok || !bytes.Equal(d.IdentityKey, b.IdentityKey) {
			t.Fatalf("bundle of %s not in the entry as given", b.DeviceID)
		}
	}

	k = firstUpload(t, phone, &a2)
	k.ReplaceAccount = true
	if got := upload(t, s, phone, k); got.Type != protocol.TypeKeys {
		t.Fatalf("replace_account: %s %s", got.Code, got.Error)
	}
	got = call(t, s, bob, &protocol.Frame{Type: protocol.TypeKeysDevices, UserID: "alice"})
	if e := ktEntry(t, l, "alice", got.KT); !bytes.Equal(e.Account, a2.Public.Bytes()) || len(e.Devices) != 1 || e.Devices[0].ID != "phone" {
		t.Fatalf("entry after replace_account: %+v", e)
	}
	size := l.Size()
	mustOK := call(t, s, phone, &protocol.Frame{Type: protocol.TypeKeysRemove})
	if mustOK.Type != protocol.TypeKeys || l.Size() != size+1 {
		t.Fatalf("keys_remove: %s, log %d → %d", mustOK.Type, size, l.Size())
	}
	got = call(t, s, bob, &protocol.Frame{Type: protocol.TypeKeysDevices, UserID: "alice"})
	if e := ktEntry(t, l, "alice", got.KT); len(e.Devices) != 0 || len(e.Account) != 0 {
		t.Fatalf("entry after the last device went: %+v", e)
	}
}

// TestKTFramesOff: without a log the kt_* frames are not_found.
func TestKTFramesOff(t *testing.T) {
	r := newPrekeyRig(t)
	s := r.service(DefaultConfig(), nil, 1)
	for _, f := range []*protocol.Frame{{Type: protocol.TypeKTKeys}, {Type: protocol.TypeKTLeaves}, {Type: protocol.TypeKTConsistency, From: 1, To: 1}} {
		if got := call(t, s, Caller{User: "a", Device: "d"}, f); got.Code != protocol.CodeNotFound {
			t.Errorf("%s without a log: %s %s", f.Type, got.Type, got.Code)
		}
	}
}
