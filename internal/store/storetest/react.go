package storetest

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// react is a reaction by user to target of conv with emoji.
func (e *env) react(conv, target uint64, user, emoji string, remove bool, check func(store.Message) (store.Message, error)) store.Append {
	m := e.msg(conv, user, "", emoji)
	m.Kind, m.TargetSeq = "react", target
	if remove {
		m.Kind = "unreact"
	}
	return store.Append{Msg: m, Check: check, React: &store.React{Emoji: emoji, Remove: remove}}
}

// testReact: a reaction takes a seq and changes the target's counts and
// the reactor's set together; one that changes nothing (twice the same
// emoji, removing one never added) and one Check refuses store nothing;
// an edit keeps the counts, a recall clears them; counts and sets survive
// a reopen.
func testReact(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	e.send(t, 1, "alice", 2)
	must := func(a store.Append) store.Message {
		t.Helper()
		res, err := e.s.Append(ctx, a)
		if err != nil {
			t.Fatalf("Append(%s %s by %s on %d): %v", a.Msg.Kind, a.React.Emoji, a.Msg.Sender, a.Msg.TargetSeq, err)
		}
		return res.Msg
	}
	if ev := must(e.react(1, 1, "alice", "👍", false, nil)); ev.Seq != 3 || ev.Kind != "react" || ev.TargetSeq != 1 {
		t.Fatalf("reaction event = %+v, want seq 3 of kind react on 1", ev)
	}
	must(e.react(1, 1, "bob", "👍", false, nil))
	must(e.react(1, 1, "bob", "❤️", false, nil))
	must(e.react(1, 2, "bob", "😂", false, nil))
	for _, a := range []store.Append{e.react(1, 1, "bob", "👍", false, nil), e.react(1, 2, "alice", "😂", true, nil)} {
		if _, err := e.s.Append(ctx, a); !errors.Is(err, store.ErrConflict) {
			t.Errorf("Append(%s %s by %s) = %v, want ErrConflict", a.Msg.Kind, a.React.Emoji, a.Msg.Sender, err)
		}
	}
	refused := errors.New("refused by Check")
	if _, err := e.s.Append(ctx, e.react(1, 1, "alice", "😂", false, func(store.Message) (store.Message, error) { return store.Message{}, refused })); !errors.Is(err, refused) {
		t.Errorf("Append(refused reaction) = %v, want Check's error", err)
	}
	want1 := []store.Reaction{{Emoji: "👍", Count: 2}, {Emoji: "❤️", Count: 1}}
	check := func(what string, top uint64, want1, want2 []store.Reaction, bob []store.Reacted) {
		t.Helper()
		msgs, err := e.s.Messages(ctx, 1, 1, 100, 100)
		if err != nil || len(msgs) == 0 || msgs[len(msgs)-1].Seq != top {
			t.Fatalf("%s: Messages = %v, %v; want 1..%d", what, seqs(msgs), err, top)
		}
		if !reflect.DeepEqual(msgs[0].Reactions, want1) || !reflect.DeepEqual(msgs[1].Reactions, want2) {
			t.Errorf("%s: counts = %+v and %+v, want %+v and %+v", what, msgs[0].Reactions, msgs[1].Reactions, want1, want2)
		}
		got, err := e.s.ReactedBy(ctx, 1, "bob", 1, 100)
		if err != nil || !reflect.DeepEqual(got, bob) {
			t.Errorf("%s: ReactedBy(bob) = %+v, %v; want %+v", what, got, err, bob)
		}
		var want []store.Reacted
		for _, r := range bob {
			if r.Seq == 2 {
				want = append(want, r)
			}
		}
		if got, err := e.s.ReactedBy(ctx, 1, "bob", 2, 2); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: ReactedBy(bob, 2..2) = %+v, %v; want %+v", what, got, err, want)
		}
	}
	bob := []store.Reacted{{Seq: 1, Emojis: []string{"👍", "❤️"}}, {Seq: 2, Emojis: []string{"😂"}}}
	check("after the reactions", 6, want1, []store.Reaction{{Emoji: "😂", Count: 1}}, bob)

	must(e.react(1, 1, "alice", "👍", true, nil))
	// An edit keeps the counts.
	must(e.event(1, 1, "edit", "edited", func(t store.Message) (store.Message, error) {
		t.Body, t.Edited = "edited", true
		return t, nil
	}))
	want1 = []store.Reaction{{Emoji: "👍", Count: 1}, {Emoji: "❤️", Count: 1}}
	check("after an unreact and an edit", 8, want1, []store.Reaction{{Emoji: "😂", Count: 1}}, bob)
	e.reopen(t)
	check("after a reopen", 8, want1, []store.Reaction{{Emoji: "😂", Count: 1}}, bob)

	// The last one out removes the emoji.
	must(e.react(1, 2, "bob", "😂", true, nil))
	// A recall clears the counts.
	must(e.event(1, 1, "recall", "", func(t store.Message) (store.Message, error) {
		t.Body, t.Recalled = "", true
		return t, nil
	}))
	check("after the recall", 10, nil, nil, []store.Reacted{{Seq: 1, Emojis: []string{"👍", "❤️"}}})
}
