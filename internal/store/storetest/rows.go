package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// row returns user's conversation row of conv, failing if there is none.
func (e *env) row(t *testing.T, user string, conv uint64) store.ConvRow {
	t.Helper()
	rows, err := e.s.UserConversations(context.Background(), user)
	if err != nil {
		t.Fatalf("UserConversations(%s): %v", user, err)
	}
	for _, r := range rows {
		if r.ConvID == conv {
			return r
		}
	}
	t.Fatalf("UserConversations(%s) = %+v: no row for conversation %d", user, rows, conv)
	return store.ConvRow{}
}

func testUpdateRows(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob", "carol")
	e.send(t, 1, "alice", 3)
	if r := e.row(t, "alice", 1); r.LastSeq != 0 {
		t.Errorf("row after appends without UpdateRows: LastSeq = %d, want 0 (Append writes no rows)", r.LastSeq)
	}
	type seqs struct{ last, mention uint64 }
	steps := []struct {
		name    string
		seq     uint64
		users   []string
		mention bool
		want    map[string]seqs
	}{
		{"raise members, skip non-members and repeats", 2, []string{"alice", "bob", "dave", "alice"}, false,
			map[string]seqs{"alice": {2, 0}, "bob": {2, 0}, "carol": {0, 0}}},
		{"lower seq never lowers, raises mention", 1, []string{"alice"}, true,
			map[string]seqs{"alice": {2, 1}}},
		{"mention", 3, []string{"bob"}, true, map[string]seqs{"bob": {3, 3}, "alice": {2, 1}}},
		{"repeat is idempotent", 3, []string{"bob"}, true, map[string]seqs{"bob": {3, 3}}},
		{"older mention keeps the newer", 2, []string{"bob"}, true, map[string]seqs{"bob": {3, 3}}},
		{"no users", 3, nil, true, map[string]seqs{"alice": {2, 1}, "bob": {3, 3}, "carol": {0, 0}}},
		{"invalid ids are skipped", 3, []string{"", "not an id", "carol"}, false, map[string]seqs{"carol": {3, 0}}},
	}
	for _, st := range steps {
		if err := e.s.UpdateRows(ctx, 1, st.seq, st.users, st.mention); err != nil {
			t.Fatalf("%s: UpdateRows(%d, %v, %v): %v", st.name, st.seq, st.users, st.mention, err)
		}
		for user, w := range st.want {
			if r := e.row(t, user, 1); r.LastSeq != w.last || r.MentionSeq != w.mention {
				t.Errorf("%s: row of %s = LastSeq %d MentionSeq %d, want %d %d", st.name, user, r.LastSeq, r.MentionSeq, w.last, w.mention)
			}
		}
	}
	if rows, err := e.s.UserConversations(ctx, "dave"); err != nil || len(rows) != 0 {
		t.Errorf("UserConversations(dave), never a member = %+v, %v; want none", rows, err)
	}

	// A former member's row keeps where the membership ended.
	if _, err := e.s.RemoveMembers(ctx, 1, []string{"carol"}); err != nil {
		t.Fatalf("RemoveMembers: %v", err)
	}
	e.send(t, 1, "alice", 1)
	if err := e.s.UpdateRows(ctx, 1, 4, []string{"alice", "carol"}, true); err != nil {
		t.Fatalf("UpdateRows: %v", err)
	}
	wantCarol := store.ConvRow{ConvID: 1, UserID: "carol", Kind: store.Group, JoinSeq: 1, LeaveSeq: 3, LastSeq: 3}
	if r := e.row(t, "carol", 1); r != wantCarol {
		t.Errorf("former member's row after UpdateRows = %+v, want %+v", r, wantCarol)
	}
	// A fan-out that runs after the leave still marks what the former
	// member could see (a mention at its leave_seq).
	if err := e.s.UpdateRows(ctx, 1, 3, []string{"carol"}, true); err != nil {
		t.Fatalf("UpdateRows: %v", err)
	}
	wantCarol.MentionSeq = 3
	if r := e.row(t, "carol", 1); r != wantCarol {
		t.Errorf("former member's row after a late mention at its leave_seq = %+v, want %+v", r, wantCarol)
	}
	wantAlice := store.ConvRow{ConvID: 1, UserID: "alice", Kind: store.Group, JoinSeq: 1, LastSeq: 4, MentionSeq: 4}
	if r := e.row(t, "alice", 1); r != wantAlice {
		t.Errorf("alice's row = %+v, want %+v", r, wantAlice)
	}

	e.reopen(t)
	if r := e.row(t, "alice", 1); r != wantAlice {
		t.Errorf("after reopen: alice's row = %+v, want %+v", r, wantAlice)
	}
	if r := e.row(t, "carol", 1); r != wantCarol {
		t.Errorf("after reopen: carol's row = %+v, want %+v", r, wantCarol)
	}
}

// testUpdateRowsConcurrent runs write fan-out the way a busy group does:
// appends and their UpdateRows interleave, compensation repeats old seqs, a
// member leaves and rejoins again and again, another leaves for good, and a
// reader watches one row. Rows must end at the maximum, never go down on
// the way, and agree with the memberships.
func testUpdateRowsConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	// u6 toggles and comes first in every fan-out, so its row is read
	// long before the batch is applied: a leave or join that does not
	// exclude fan-out would be overwritten in that window.
	users := []string{"u6", "u0", "u1", "u2", "u3", "u4", "u5", "u7"}
	for i := range 120 {
		users = append(users, fmt.Sprintf("x%d", i))
	}
	e.group(t, 1, users...)
	e.send(t, 1, "u0", 1) // a leave needs a seq
	const mentionEvery = 7
	var (
		wg, readerWG sync.WaitGroup
		done         = make(chan struct{})
		appended     atomic.Uint64
		leave        atomic.Uint64
	)
	readerWG.Go(func() {
		var last, mention uint64
		for {
			select {
			case <-done:
				return
			default:
			}
			rows, err := e.s.UserConversations(ctx, "u0")
			if err != nil || len(rows) != 1 {
				t.Errorf("UserConversations(u0) = %+v, %v; want one row", rows, err)
				return
			}
			r := rows[0]
			if r.LastSeq < last || r.MentionSeq < mention {
				t.Errorf("row went down: LastSeq %d→%d, MentionSeq %d→%d", last, r.LastSeq, mention, r.MentionSeq)
				return
			}
			last, mention = r.LastSeq, r.MentionSeq
		}
	})
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				m := e.msg(1, users[1+w%6], "", fmt.Sprintf("w%d i%d", w, i))
				res, err := e.s.Append(ctx, store.Append{Msg: m})
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				seq := res.Msg.Seq
				appended.Add(1)
				if err := e.s.UpdateRows(ctx, 1, seq, users, seq%mentionEvery == 0); err != nil {
					t.Errorf("UpdateRows(%d): %v", seq, err)
				}
				// A compensation task repeating an older fan-out.
				if err := e.s.UpdateRows(ctx, 1, seq/2, users[1:5], true); err != nil {
					t.Errorf("UpdateRows(%d): %v", seq/2, err)
				}
				if w == 1 {
					// The previous toggle's fan-out has landed by now.
					if _, err := e.rowMatchesMember(1, "u6"); err != nil {
						t.Error(err)
					}
					e.toggle(t, 1, "u6")
				}
				if w == 0 && i == perWorker/2 {
					ms, err := e.s.RemoveMembers(ctx, 1, []string{"u7"})
					if err != nil || len(ms) != 1 {
						t.Errorf("RemoveMembers(u7) = %+v, %v", ms, err)
					} else {
						leave.Store(ms[0].LeaveSeq)
					}
				}
			}
		})
	}
	wg.Wait()
	close(done)
	readerWG.Wait()
	total := appended.Load() + 1
	if got := e.lastSeq(t, 1); got != total {
		t.Fatalf("LastSeq = %d, want %d", got, total)
	}
	wantMention := total - total%mentionEvery
	for _, u := range slices.Concat(users[1:7], users[8:]) {
		if r := e.row(t, u, 1); r.LastSeq != total || r.MentionSeq != wantMention {
			t.Errorf("row of %s = LastSeq %d MentionSeq %d, want %d %d", u, r.LastSeq, r.MentionSeq, total, wantMention)
		}
	}
	// Fan-out of a seq starts after its append, so any seq that reached
	// u7 before the leave is ≤ LeaveSeq, and the leave raised the row to it.
	if _, err := e.rowMatchesMember(1, "u6"); err != nil {
		t.Error(err)
	}
	r, err := e.rowMatchesMember(1, "u7")
	if err != nil {
		t.Error(err)
	}
	if l := leave.Load(); r.LeaveSeq != l || r.LastSeq != l || r.MentionSeq > l {
		t.Errorf("row of u7 (left at %d) = %+v, want LeaveSeq = LastSeq = %d, MentionSeq ≤ it", l, r, l)
	}
}

// toggle removes user from conv if a current member, else adds it back.
func (e *env) toggle(t *testing.T, conv uint64, user string) {
	ctx := context.Background()
	left, err := e.s.RemoveMembers(ctx, conv, []string{user})
	if err == nil && len(left) == 0 {
		_, err = e.s.AddMembers(ctx, conv, []string{user}, store.RoleMember)
	}
	if err != nil {
		t.Errorf("toggle %s: %v", user, err)
	}
}

// rowMatchesMember reports whether user's row carries its membership's
// seqs, and returns the row.
func (e *env) rowMatchesMember(conv uint64, user string) (store.ConvRow, error) {
	ctx := context.Background()
	m, err := e.s.Member(ctx, conv, user)
	if err != nil {
		return store.ConvRow{}, fmt.Errorf("Member(%s): %w", user, err)
	}
	rows, err := e.s.UserConversations(ctx, user)
	if err != nil {
		return store.ConvRow{}, fmt.Errorf("UserConversations(%s): %w", user, err)
	}
	for _, r := range rows {
		if r.ConvID != conv {
			continue
		}
		if r.JoinSeq != m.JoinSeq || r.LeaveSeq != m.LeaveSeq {
			return r, fmt.Errorf("row of %s = %+v, membership %+v: JoinSeq and LeaveSeq differ", user, r, m)
		}
		return r, nil
	}
	return store.ConvRow{}, fmt.Errorf("%s has no row for conversation %d", user, conv)
}
