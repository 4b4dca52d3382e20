package cassandra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// TestStaleOwnerMembershipFenced: membership changes are fenced like
// appends. An owner that lost its lease without noticing (a stalled
// process) gets none of its membership changes acknowledged after the
// takeover; once the new owner has loaded the conversation they are
// refused outright (nothing changes), and one that landed before is seen
// by the new owner, with join_seq and leave_seq within the dense seqs.
func TestStaleOwnerMembershipFenced(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	var leases leaseTable
	cfgA := cfg
	cfgA.Lease = leases.grant()
	a := openT(t, cfgA)
	var ids atomic.Uint64
	send := func(s *Store, conv uint64, who string) (store.AppendResult, error) {
		id := ids.Add(1)
		return s.Append(ctx, store.Append{Msg: store.Message{ConvID: conv, MsgID: id, Sender: who,
			ClientMsgID: fmt.Sprintf("c%d", id), Kind: "text", Body: "hi", ServerTime: baseTime + int64(id)}})
	}
	mustSend := func(s *Store, conv uint64, n int) uint64 {
		t.Helper()
		var last uint64
		for range n {
			res, err := send(s, conv, "alice")
			if err != nil {
				t.Fatalf("append to %d: %v", conv, err)
			}
			last = res.Msg.Seq
		}
		return last
	}
	// Conversations 1..3, owned by A: alice (owner) and bob; bob is an
	// admin, muted, from A's acknowledged changes.
	for conv := uint64(1); conv <= 3; conv++ {
		if err := a.CreateConversation(ctx, store.Conversation{ID: conv, Kind: store.Group, CreatedAt: baseTime},
			[]store.Member{{UserID: "alice", Role: store.RoleOwner}}); err != nil {
			t.Fatalf("CreateConversation: %v", err)
		}
		mustSend(a, conv, 3)
		if _, err := a.AddMembers(ctx, conv, []string{"bob"}, store.RoleMember); err != nil {
			t.Fatalf("owner's AddMembers: %v", err)
		}
		if err := a.SetRole(ctx, conv, "bob", store.RoleAdmin); err != nil {
			t.Fatalf("owner's SetRole: %v", err)
		}
		if err := a.SetMuted(ctx, conv, "bob", true); err != nil {
			t.Fatalf("owner's SetMuted: %v", err)
		}
	}
	wantBob := store.Member{UserID: "bob", Role: store.RoleAdmin, JoinSeq: 4, Muted: true}

	// Takeover: B holds a newer epoch. It writes to conversation 1,
	// changes the membership of 2 without writing a message first, and
	// leaves 3 untouched for now.
	cfgB := cfg
	cfgB.Lease = leases.grant()
	b := openT(t, cfgB)
	top1 := mustSend(b, 1, 2)
	if got, err := b.AddMembers(ctx, 2, []string{"erin"}, store.RoleMember); err != nil || got[0].JoinSeq != 4 {
		t.Fatalf("new owner's AddMembers before any message = %+v, %v; want join_seq 4", got, err)
	}

	// The stale owner's changes of 1 and 2 (loaded by B) are refused and
	// change nothing.
	stale := func(conv uint64) []error {
		_, errAdd := a.AddMembers(ctx, conv, []string{"carol", "dave"}, store.RoleMember)
		_, errRemove := a.RemoveMembers(ctx, conv, []string{"bob"})
		return []error{errAdd, errRemove, a.SetRole(ctx, conv, "bob", store.RoleMember), a.SetMuted(ctx, conv, "bob", false)}
	}
	for conv := uint64(1); conv <= 2; conv++ {
		for i, err := range stale(conv) {
			if !errors.Is(err, store.ErrNotOwner) {
				t.Errorf("conversation %d: stale owner's change #%d: %v, want ErrNotOwner", conv, i, err)
			}
		}
		wantUsers := []string{"alice", "bob"}
		if conv == 2 {
			wantUsers = append(wantUsers, "erin")
		}
		ms, err := b.Members(ctx, conv)
		if err != nil || !slices.Equal(userIDs(ms), wantUsers) {
			t.Errorf("conversation %d: members %v, %v; want %v", conv, userIDs(ms), err, wantUsers)
		}
		bob := wantBob
		bob.ConvID = conv
		if m, err := b.Member(ctx, conv, "bob"); err != nil || m != bob {
			t.Errorf("conversation %d: bob %+v, %v; want %+v (the stale owner's changes refused)", conv, m, err, bob)
		}
		for _, u := range []string{"carol", "dave"} {
			if m, err := b.Member(ctx, conv, u); !errors.Is(err, store.ErrNotMember) {
				t.Errorf("conversation %d: %s %+v, %v; want never a member", conv, u, m, err)
			}
			if rows, err := b.UserConversations(ctx, u); err != nil || len(rows) != 0 {
				t.Errorf("%s has rows %+v, %v; want none", u, rows, err)
			}
		}
		if c, err := b.Conversation(ctx, conv); err != nil || c.Members != len(wantUsers) {
			t.Errorf("conversation %d: count %d, %v; want %d", conv, c.Members, err, len(wantUsers))
		}
	}
	// Nothing the stale owner did moved conversation 1's seqs.
	if top, err := b.LastSeq(ctx, 1); err != nil || top != top1 {
		t.Errorf("last seq of 1 = %d, %v; want %d", top, err, top1)
	}

	// Conversation 3: the stale owner changes it before B loaded it. The
	// change is not acknowledged (the lease check after it fails) but it
	// landed before B's fence, so B sees it, with join_seq right above the
	// top B then finds, and B's own changes and messages go on from there.
	if _, err := a.AddMembers(ctx, 3, []string{"frank"}, store.RoleMember); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("stale owner's AddMembers before the new owner loaded: %v, want ErrNotOwner (never acknowledged)", err)
	}
	frank, err := b.Member(ctx, 3, "frank")
	if err != nil || frank.JoinSeq != 4 || frank.LeaveSeq != 0 {
		t.Errorf("frank (the unacknowledged join) = %+v, %v; want join_seq 4", frank, err)
	}
	seq := mustSend(b, 3, 1)
	if seq != 4 {
		t.Errorf("new owner's first message of 3 got seq %d, want 4", seq)
	}
	if left, err := b.RemoveMembers(ctx, 3, []string{"frank"}); err != nil || len(left) != 1 || left[0].LeaveSeq != seq {
		t.Errorf("new owner's RemoveMembers(frank) = %+v, %v; want leave_seq %d", left, err, seq)
	}
	// And now the stale owner is refused outright there too.
	for i, err := range stale(3) {
		if !errors.Is(err, store.ErrNotOwner) {
			t.Errorf("conversation 3: stale owner's change #%d: %v, want ErrNotOwner", i, err)
		}
	}
	if m, err := b.Member(ctx, 3, "frank"); err != nil || m.LeaveSeq != seq || m.JoinSeq != 4 {
		t.Errorf("frank after the stale owner's changes = %+v, %v; want [4, %d]", m, err, seq)
	}
	// The seqs of every conversation are dense: 1..top, each once.
	for conv := uint64(1); conv <= 3; conv++ {
		top, err := b.LastSeq(ctx, conv)
		if err != nil {
			t.Fatalf("LastSeq: %v", err)
		}
		msgs, err := b.Messages(ctx, conv, 1, top, 100)
		if err != nil || len(msgs) != int(top) {
			t.Fatalf("conversation %d: %d messages up to %d, %v", conv, len(msgs), top, err)
		}
		for i, m := range msgs {
			if m.Seq != uint64(i+1) {
				t.Errorf("conversation %d: message %d at seq %d", conv, i, m.Seq)
			}
		}
	}
}

func userIDs(ms []store.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.UserID
	}
	slices.Sort(out)
	return out
}
