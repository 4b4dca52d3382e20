package storetest

import (
	"context"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func testReadPositions(t *testing.T, e *env) {
	ctx := context.Background()
	steps := []struct {
		device string
		conv   uint64
		set    uint64
		want   uint64
	}{
		{"", 1, 5, 5},
		{"", 1, 3, 5}, // never lowered
		{"", 1, 5, 5},
		{"phone", 1, 2, 2}, // per device, apart from the per-user position
		{"laptop", 1, 9, 9},
		{"phone", 1, 1, 2},
		{"", 2, 1, 1}, // per conversation
		{"", 1, 6, 6},
	}
	for i, st := range steps {
		got, err := e.s.SetRead(ctx, "alice", st.device, st.conv, st.set)
		if err != nil || got != st.want {
			t.Errorf("step %d: SetRead(%q, conv %d, %d) = %d, %v; want %d", i, st.device, st.conv, st.set, got, err, st.want)
		}
	}
	for _, tc := range []struct {
		user, device string
		conv         uint64
		want         uint64
	}{
		{"alice", "", 1, 6}, {"alice", "phone", 1, 2}, {"alice", "laptop", 1, 9},
		{"alice", "tablet", 1, 0}, {"alice", "", 2, 1}, {"bob", "", 1, 0},
	} {
		if got, err := e.s.Read(ctx, tc.user, tc.device, tc.conv); err != nil || got != tc.want {
			t.Errorf("Read(%s, %q, %d) = %d, %v; want %d", tc.user, tc.device, tc.conv, got, err, tc.want)
		}
	}
	raceRaise(t, func(seq uint64) (uint64, error) { return e.s.SetRead(ctx, "carol", "", 3, seq) })
	if got, err := e.s.Read(ctx, "carol", "", 3); err != nil || got != workers*perWorker {
		t.Errorf("Read after concurrent raises = %d, %v; want %d", got, err, workers*perWorker)
	}
}

func testDeliveredPositions(t *testing.T, e *env) {
	ctx := context.Background()
	for i, st := range []struct{ set, want uint64 }{{4, 4}, {2, 4}, {7, 7}} {
		got, err := e.s.SetDelivered(ctx, "alice", 1, st.set)
		if err != nil || got != st.want {
			t.Errorf("step %d: SetDelivered(%d) = %d, %v; want %d", i, st.set, got, err, st.want)
		}
	}
	if got, err := e.s.Delivered(ctx, "alice", 2); err != nil || got != 0 {
		t.Errorf("Delivered of another conversation = %d, %v; want 0", got, err)
	}
	if got, err := e.s.Read(ctx, "alice", "", 1); err != nil || got != 0 {
		t.Errorf("Read after SetDelivered = %d, %v; want 0 (separate positions)", got, err)
	}
	raceRaise(t, func(seq uint64) (uint64, error) { return e.s.SetDelivered(ctx, "bob", 1, seq) })
	if got, err := e.s.Delivered(ctx, "bob", 1); err != nil || got != workers*perWorker {
		t.Errorf("Delivered after concurrent raises = %d, %v; want %d", got, err, workers*perWorker)
	}
}

// raceRaise raises a position to 1..workers*perWorker from many goroutines in
// interleaved order; every call must return at least the value it set.
func raceRaise(t *testing.T, set func(uint64) (uint64, error)) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				seq := uint64(i*workers + w + 1)
				got, err := set(seq)
				if err != nil || got < seq {
					t.Errorf("raise to %d = %d, %v; want ≥ %d", seq, got, err, seq)
				}
			}
		})
	}
	wg.Wait()
}

func testClosed(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	if err := e.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := e.s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"CreateConversation", func() error {
			return e.s.CreateConversation(ctx, store.Conversation{ID: 2, Kind: store.Group}, nil)
		}},
		{"Direct", func() error { _, err := e.s.Direct(ctx, "a", "b", 3, baseTime); return err }},
		{"Conversation", func() error { _, err := e.s.Conversation(ctx, 1); return err }},
		{"Member", func() error { _, err := e.s.Member(ctx, 1, "alice"); return err }},
		{"Members", func() error { _, err := e.s.Members(ctx, 1); return err }},
		{"Pending", func() error { _, err := e.s.Pending(ctx, 10); return err }},
		{"FanoutDone", func() error { return e.s.FanoutDone(ctx, 1, []uint64{1}) }},
		{"AddMembers", func() error { _, err := e.s.AddMembers(ctx, 1, []string{"bob"}, store.RoleMember); return err }},
		{"RemoveMembers", func() error { _, err := e.s.RemoveMembers(ctx, 1, []string{"alice"}); return err }},
		{"SetRole", func() error { return e.s.SetRole(ctx, 1, "alice", store.RoleAdmin) }},
		{"SetMuted", func() error { return e.s.SetMuted(ctx, 1, "alice", true) }},
		{"SetTier", func() error { return e.s.SetTier(ctx, 1, 1) }},
		{"UpdateRows", func() error { return e.s.UpdateRows(ctx, 1, 1, []string{"alice"}, false) }},
		{"Append", func() error { _, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "x", "x")}); return err }},
		{"Messages", func() error { _, err := e.s.Messages(ctx, 1, 1, 10, 10); return err }},
		{"Latest", func() error { _, err := e.s.Latest(ctx, 1, 0, 0, 10); return err }},
		{"UserConversations", func() error { _, err := e.s.UserConversations(ctx, "alice"); return err }},
		{"SetRead", func() error { _, err := e.s.SetRead(ctx, "alice", "", 1, 1); return err }},
		{"Read", func() error { _, err := e.s.Read(ctx, "alice", "", 1); return err }},
		{"SetDelivered", func() error { _, err := e.s.SetDelivered(ctx, "alice", 1, 1); return err }},
		{"Delivered", func() error { _, err := e.s.Delivered(ctx, "alice", 1); return err }},
		{"AsOf", func() error { return e.s.AsOf(ctx, 1, 1, nil) }},
		{"DirectE2E", func() error { _, err := e.s.DirectE2E(ctx, "a", "b", 4, baseTime); return err }},
		{"UploadKeys", func() error { _, err := e.s.UploadKeys(ctx, "alice", "phone", upload(1, 1, 1, 1)); return err }},
		{"TakeBundle", func() error { _, err := e.s.TakeBundle(ctx, "alice", "phone"); return err }},
		{"KeyDevices", func() error { _, err := e.s.KeyDevices(ctx, "alice"); return err }},
		{"PreKeyCounts", func() error { _, _, err := e.s.PreKeyCounts(ctx, "alice", "phone"); return err }},
		{"RemoveDevice", func() error { return e.s.RemoveDevice(ctx, "alice", "phone") }},
		{"KTAppend", func() error { return e.s.KTAppend(ctx, 0, []byte("leaf")) }},
		{"KTLeaves", func() error { _, err := e.s.KTLeaves(ctx, 0, 10); return err }},
		{"KTKeys", func() error { _, err := e.s.KTKeys(ctx, []byte("keys")); return err }},
	}
	if r, ok := e.s.(store.DeliveredRaiser); ok {
		calls = append(calls, struct {
			name string
			call func() error
		}{"RaiseDelivered", func() error {
			return r.RaiseDelivered(ctx, []store.Delivered{{User: "alice", ConvID: 1, Seq: 1}})
		}})
	}
	for _, c := range calls {
		wantErr(t, c.name+" after Close", c.call(), store.ErrClosed)
	}
}
