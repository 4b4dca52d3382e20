package storetest

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// testNotifyPrefs: conversation mutes (until a time and forever) are
// stored per user and conversation, listed, replaced and removed; a
// do-not-disturb with and without a daily window is stored, replaced and
// removed; users do not see each other's; all of it survives a reopen;
// bad arguments are refused and change nothing.
func testNotifyPrefs(t *testing.T, e *env) {
	ctx := context.Background()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("mute 1", e.s.SetConvMute(ctx, "alice", 1, store.MuteForever))
	must("mute 2", e.s.SetConvMute(ctx, "alice", 2, baseTime+3600_000))
	must("mute 1<<63", e.s.SetConvMute(ctx, "alice", 1<<63|5, baseTime))
	must("bob mute 1", e.s.SetConvMute(ctx, "bob", 1, baseTime))
	must("alice2 mute 9", e.s.SetConvMute(ctx, "alice2", 9, baseTime)) // a user id with alice's as a prefix
	if got, err := e.s.ConvMute(ctx, "alice", 2); err != nil || got != baseTime+3600_000 {
		t.Fatalf("ConvMute(alice, 2) = %d, %v", got, err)
	}
	if got, err := e.s.ConvMute(ctx, "alice", 3); err != nil || got != 0 {
		t.Fatalf("ConvMute(alice, 3) never muted = %d, %v", got, err)
	}
	want := map[uint64]int64{1: store.MuteForever, 2: baseTime + 3600_000, 1<<63 | 5: baseTime}
	if got, err := e.s.ConvMutes(ctx, "alice"); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ConvMutes(alice) = %v, %v; want %v", got, err, want)
	}
	// Replaced, then removed.
	must("mute 2 again", e.s.SetConvMute(ctx, "alice", 2, store.MuteForever))
	must("unmute 1", e.s.SetConvMute(ctx, "alice", 1, 0))
	must("unmute never muted", e.s.SetConvMute(ctx, "alice", 4, 0))
	want = map[uint64]int64{2: store.MuteForever, 1<<63 | 5: baseTime}
	if got, err := e.s.ConvMutes(ctx, "alice"); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ConvMutes(alice) after changes = %v, %v; want %v", got, err, want)
	}
	if got, err := e.s.ConvMutes(ctx, "carol"); err != nil || len(got) != 0 {
		t.Fatalf("ConvMutes(carol) = %v, %v; want none", got, err)
	}

	window := store.DND{Until: baseTime + 60_000, Daily: true, Start: 22 * 60, End: 7 * 60, Offset: -300}
	must("dnd", e.s.SetDND(ctx, "alice", window))
	must("dnd bob", e.s.SetDND(ctx, "bob", store.DND{Until: baseTime}))
	if got, err := e.s.DND(ctx, "alice"); err != nil || got != window {
		t.Fatalf("DND(alice) = %+v, %v; want %+v", got, err, window)
	}
	if got, err := e.s.DND(ctx, "carol"); err != nil || !got.Zero() {
		t.Fatalf("DND(carol) = %+v, %v; want none", got, err)
	}

	// Refused, changing nothing.
	bad := []struct {
		name string
		err  error
	}{
		{"mute bad user", e.s.SetConvMute(ctx, "bad user", 1, baseTime)},
		{"mute conversation 0", e.s.SetConvMute(ctx, "alice", 0, baseTime)},
		{"mute negative", e.s.SetConvMute(ctx, "alice", 2, -1)},
		{"mute past forever", e.s.SetConvMute(ctx, "alice", 2, store.MuteForever+1)},
		{"dnd bad user", e.s.SetDND(ctx, "", window)},
		{"dnd start out of range", e.s.SetDND(ctx, "alice", store.DND{Daily: true, Start: 1440, End: 1})},
		{"dnd offset out of range", e.s.SetDND(ctx, "alice", store.DND{Daily: true, Start: 1, End: 2, Offset: 15 * 60})},
		{"dnd window without daily", e.s.SetDND(ctx, "alice", store.DND{Start: 1, End: 2})},
		{"dnd negative until", e.s.SetDND(ctx, "alice", store.DND{Until: -5})},
	}
	for _, b := range bad {
		if b.err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
	if got, _ := e.s.ConvMute(ctx, "bad user", 1); got != 0 {
		t.Errorf("ConvMute(bad user) = %d", got)
	}

	e.reopen(t)
	if got, err := e.s.ConvMutes(ctx, "alice"); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ConvMutes(alice) after reopen = %v, %v; want %v", got, err, want)
	}
	if got, err := e.s.DND(ctx, "alice"); err != nil || got != window {
		t.Fatalf("DND(alice) after reopen = %+v, %v; want %+v", got, err, window)
	}
	must("dnd off", e.s.SetDND(ctx, "alice", store.DND{}))
	if got, err := e.s.DND(ctx, "alice"); err != nil || !got.Zero() {
		t.Fatalf("DND(alice) after off = %+v, %v", got, err)
	}
	if got, err := e.s.DND(ctx, "bob"); err != nil || got != (store.DND{Until: baseTime}) {
		t.Fatalf("DND(bob) = %+v, %v", got, err)
	}

	// Concurrent writers of one user's mutes: each conversation ends as
	// its last write said.
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			conv := uint64(100 + i)
			if err := e.s.SetConvMute(ctx, "dave", conv, baseTime+int64(i)); err != nil {
				t.Error(err)
			}
			if i%2 == 1 {
				if err := e.s.SetConvMute(ctx, "dave", conv, 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got, err := e.s.ConvMutes(ctx, "dave")
	if err != nil || len(got) != 16 {
		t.Fatalf("dave's mutes after 32 writers: %d, %v", len(got), err)
	}
	for c, u := range got {
		if i := int(c - 100); i%2 == 1 || u != baseTime+int64(i) {
			t.Errorf("dave's mute of %d = %d, want %s", c, u, fmt.Sprint(baseTime+int64(i)))
		}
	}
}
