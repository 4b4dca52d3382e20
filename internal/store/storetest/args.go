package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// bad is not a valid id (protocol.ValidID): it has a space.
const bad = "bad user"

// testBadArguments checks what the Store documentation promises for
// invalid arguments: a call that would store one fails with an error that
// is none of the sentinels and stores nothing, RemoveMembers and
// UpdateRows skip invalid ids, and a call that looks one up finds nothing.
func testBadArguments(t *testing.T, e *env) {
	ctx := context.Background()
	s := e.s
	e.group(t, 1, "alice", "bob")
	e.send(t, 1, "alice", 1)
	if _, err := s.UploadKeys(ctx, "alice", "phone", upload(1, 1, 2, 1)); err != nil {
		t.Fatalf("UploadKeys: %v", err)
	}
	member := func(u string, r store.Role) []store.Member { return []store.Member{{UserID: u, Role: r}} }
	msg := func(edit func(*store.Message)) store.Append {
		m := e.msg(1, "alice", "", "x")
		edit(&m)
		return store.Append{Msg: m}
	}
	refused := []struct {
		name string
		call func() error
	}{
		{"CreateConversation kind 0", func() error {
			return s.CreateConversation(ctx, store.Conversation{ID: 2}, member("alice", store.RoleMember))
		}},
		{"CreateConversation invalid member", func() error {
			return s.CreateConversation(ctx, store.Conversation{ID: 2, Kind: store.Group}, member(bad, store.RoleMember))
		}},
		{"CreateConversation invalid role", func() error {
			return s.CreateConversation(ctx, store.Conversation{ID: 2, Kind: store.Group}, member("alice", store.RoleOwner+1))
		}},
		{"Direct", func() error { _, err := s.Direct(ctx, "alice", bad, 2, baseTime); return err }},
		{"Direct empty id", func() error { _, err := s.Direct(ctx, "", "alice", 2, baseTime); return err }},
		{"DirectE2E", func() error { _, err := s.DirectE2E(ctx, bad, "alice", 2, baseTime); return err }},
		{"AddMembers invalid id", func() error {
			_, err := s.AddMembers(ctx, 1, []string{"carol", bad}, store.RoleMember)
			return err
		}},
		{"AddMembers invalid role", func() error {
			_, err := s.AddMembers(ctx, 1, []string{"carol"}, store.RoleOwner+1)
			return err
		}},
		{"SetRole invalid role", func() error { return s.SetRole(ctx, 1, "bob", store.RoleOwner+1) }},
		{"Append invalid sender", func() error {
			_, err := s.Append(ctx, msg(func(m *store.Message) { m.Sender = bad }))
			return err
		}},
		{"Append invalid sender device", func() error {
			_, err := s.Append(ctx, msg(func(m *store.Message) { m.SenderDevice = bad }))
			return err
		}},
		{"Append msg id 0", func() error {
			_, err := s.Append(ctx, msg(func(m *store.Message) { m.MsgID = 0 }))
			return err
		}},
		{"SetRead invalid user", func() error { _, err := s.SetRead(ctx, bad, "", 1, 1); return err }},
		{"SetRead invalid device", func() error { _, err := s.SetRead(ctx, "alice", bad, 1, 1); return err }},
		{"SetDelivered", func() error { _, err := s.SetDelivered(ctx, bad, 1, 1); return err }},
		{"UploadKeys invalid user", func() error { _, err := s.UploadKeys(ctx, bad, "phone", upload(2, 1, 1, 1)); return err }},
		{"UploadKeys no device", func() error { _, err := s.UploadKeys(ctx, "alice", "", upload(2, 1, 1, 1)); return err }},
	}
	if r, ok := s.(store.DeliveredRaiser); ok {
		refused = append(refused, struct {
			name string
			call func() error
		}{"RaiseDelivered", func() error {
			return r.RaiseDelivered(ctx, []store.Delivered{{User: "bob", ConvID: 1, Seq: 1}, {User: bad, ConvID: 1, Seq: 1}})
		}})
	}
	sentinels := []error{store.ErrNotFound, store.ErrNotMember, store.ErrExists, store.ErrConflict, store.ErrClosed, store.ErrNotOwner}
	for _, c := range refused {
		err := c.call()
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for _, s := range sentinels {
			if errors.Is(err, s) {
				t.Errorf("%s: error %v is %v, want none of the sentinels", c.name, err, s)
			}
		}
	}
	// Nothing of that was stored.
	if _, err := s.Conversation(ctx, 2); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Conversation(2) after refused creations: %v, want ErrNotFound", err)
	}
	if ms, err := s.Members(ctx, 1); err != nil || len(ms) != 2 {
		t.Errorf("Members after refused additions = %+v, %v; want alice and bob", ms, err)
	}
	if m, err := s.Member(ctx, 1, "bob"); err != nil || m.Role != store.RoleMember {
		t.Errorf("Member(bob) after a refused SetRole = %+v, %v; want a member", m, err)
	}
	if last := e.lastSeq(t, 1); last != 1 {
		t.Errorf("last seq after refused appends = %d, want 1", last)
	}
	if devs, err := s.KeyDevices(ctx, "alice"); err != nil || len(devs) != 1 {
		t.Errorf("KeyDevices(alice) after refused uploads = %+v, %v; want phone only", devs, err)
	}
	if got, err := s.Delivered(ctx, "bob", 1); err != nil {
		t.Errorf("Delivered(bob): %v", err)
	} else if _, ok := s.(store.DeliveredRaiser); ok && got != 0 {
		t.Errorf("Delivered(bob) after a refused RaiseDelivered = %d, want 0", got)
	}

	// An invalid ReadBy is not honoured; the message is stored.
	a := msg(func(*store.Message) {})
	a.ReadBy = &store.Reader{User: bad}
	if res, err := s.Append(ctx, a); err != nil || res.ReadRaised || res.Msg.Seq != 2 {
		t.Errorf("Append with an invalid ReadBy = %+v, %v; want seq 2, ReadRaised false", res, err)
	}

	// Invalid ids are skipped where a call takes many.
	if out, err := s.RemoveMembers(ctx, 1, []string{bad, "bob", ""}); err != nil || len(out) != 1 || out[0].UserID != "bob" {
		t.Errorf("RemoveMembers(bad, bob, \"\") = %+v, %v; want bob's membership", out, err)
	}

	// Lookups of an invalid id find nothing.
	wantErr(t, "Member(bad)", func() error { _, err := s.Member(ctx, 1, bad); return err }(), store.ErrNotMember)
	wantErr(t, "SetRole(bad)", s.SetRole(ctx, 1, bad, store.RoleAdmin), store.ErrNotMember)
	wantErr(t, "SetMuted(bad)", s.SetMuted(ctx, 1, bad, true), store.ErrNotMember)
	wantErr(t, "TakeBundle(bad device)", func() error { _, err := s.TakeBundle(ctx, "alice", bad); return err }(), store.ErrNotFound)
	wantErr(t, "TakeBundle(no device)", func() error { _, err := s.TakeBundle(ctx, "alice", ""); return err }(), store.ErrNotFound)
	zeros := []struct {
		name string
		call func() (uint64, error)
	}{
		{"Read(bad)", func() (uint64, error) { return s.Read(ctx, bad, "", 1) }},
		{"Read(bad device)", func() (uint64, error) { return s.Read(ctx, "alice", bad, 1) }},
		{"Delivered(bad)", func() (uint64, error) { return s.Delivered(ctx, bad, 1) }},
		{"PreKeyCounts(bad)", func() (uint64, error) {
			a, b, err := s.PreKeyCounts(ctx, bad, "phone")
			return uint64(a + b), err
		}},
	}
	for _, z := range zeros {
		if got, err := z.call(); err != nil || got != 0 {
			t.Errorf("%s = %d, %v; want 0, nil", z.name, got, err)
		}
	}
	if rows, err := s.UserConversations(ctx, bad); err != nil || len(rows) != 0 {
		t.Errorf("UserConversations(bad) = %+v, %v; want none", rows, err)
	}
	if devs, err := s.KeyDevices(ctx, bad); err != nil || len(devs) != 0 {
		t.Errorf("KeyDevices(bad) = %+v, %v; want none", devs, err)
	}
	if err := s.RemoveDevice(ctx, "alice", bad); err != nil {
		t.Errorf("RemoveDevice(bad device) = %v, want nil", err)
	}
	if pk, kem, err := s.PreKeyCounts(ctx, "alice", "phone"); err != nil || pk != 2 || kem != 2 {
		t.Errorf("PreKeyCounts(alice, phone) after RemoveDevice(bad device) = %d, %d, %v; want 2, 2", pk, kem, err)
	}
}
