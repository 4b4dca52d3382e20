package storetest

import (
	"context"
	"slices"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// state returns a coalescible state message.
func (e *env) state(conv uint64, key, body string) store.Message {
	m := e.msg(conv, "alice", "", body)
	m.Kind, m.CoalesceKey = "state", key
	return m
}

func (e *env) appendMsg(t *testing.T, m store.Message) store.Message {
	t.Helper()
	res, err := e.s.Append(context.Background(), store.Append{Msg: m})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return res.Msg
}

// superseded is m as reads return it once a later state replaced it.
func superseded(m store.Message) store.Message {
	m.Superseded, m.Body = true, ""
	return m
}

func testCoalesce(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	e.group(t, 2, "alice")
	sent := []store.Message{
		e.appendMsg(t, e.state(1, "packet-1", "100 left")),
		e.appendMsg(t, e.msg(1, "alice", "", "plain text")),
		e.appendMsg(t, e.state(1, "packet-1", "50 left")),
		e.appendMsg(t, e.state(1, "packet-2", "open")),
		e.appendMsg(t, e.state(1, "packet-1", "0 left")),
	}
	other := e.appendMsg(t, e.state(2, "packet-1", "other conversation"))
	for _, m := range append(sent, other) {
		if m.Superseded || m.Body == "" {
			t.Errorf("Append returned %+v; want the message as sent, not superseded", m)
		}
	}
	// Seqs stay dense; superseded states keep every field but the body.
	want := []store.Message{superseded(sent[0]), sent[1], superseded(sent[2]), sent[3], sent[4]}
	check := func(when string) {
		t.Helper()
		all, err := e.s.Messages(ctx, 1, 1, 10, 10)
		if err != nil || len(all) != len(want) {
			t.Fatalf("%s: Messages = %v, %v; want 1..5", when, seqs(all), err)
		}
		for i := range want {
			if !sameMsg(all[i], want[i]) {
				t.Errorf("%s: Messages seq %d = %+v, want %+v", when, want[i].Seq, all[i], want[i])
			}
		}
		latest, err := e.s.Latest(ctx, 1, 0, 0, 10)
		if err != nil || len(latest) != len(want) {
			t.Fatalf("%s: Latest = %v, %v; want 1..5", when, seqs(latest), err)
		}
		for i := range want {
			if !sameMsg(latest[i], want[i]) {
				t.Errorf("%s: Latest seq %d = %+v, want %+v", when, want[i].Seq, latest[i], want[i])
			}
		}
		// The state that supersedes may lie outside the window read.
		window, err := e.s.Messages(ctx, 1, 3, 3, 10)
		if err != nil || len(window) != 1 || !sameMsg(window[0], want[2]) {
			t.Errorf("%s: Messages(3, 3) = %+v, %v; want [%+v]", when, window, err, want[2])
		}
		if got, err := e.s.Messages(ctx, 2, 1, 1, 1); err != nil || len(got) != 1 || !sameMsg(got[0], other) {
			t.Errorf("%s: conversation 2 = %+v, %v; want its own state %+v, not superseded", when, got, err, other)
		}
	}
	check("before reopen")
	e.reopen(t)
	check("after reopen")

	// Superseded is computed on reads; a caller's value is not stored.
	m := e.state(1, "packet-2", "closed")
	m.Superseded = true
	six := e.appendMsg(t, m)
	got, err := e.s.Messages(ctx, 1, 4, 6, 10)
	if err != nil || len(got) != 3 || !sameMsg(got[0], superseded(sent[3])) || got[2].Superseded || got[2].Body != "closed" {
		t.Errorf("Messages(4, 6) = %+v, %v; want seq 4 superseded by seq 6 %+v", got, err, six)
	}
}

func testMentions(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob", "carol")
	m := e.msg(1, "alice", "m1", "hi @bob @carol")
	m.Mentions = []string{"bob", "carol"}
	one := e.appendMsg(t, m)
	m = e.msg(1, "alice", "m2", "hi @everyone")
	m.MentionAll = true
	m.Mentions = []string{}
	two := e.appendMsg(t, m)
	if !slices.Equal(one.Mentions, []string{"bob", "carol"}) || !two.MentionAll {
		t.Errorf("Append results = %+v, %+v; want the mentions as sent", one, two)
	}
	check := func(when string) {
		t.Helper()
		got, err := e.s.Messages(ctx, 1, 1, 2, 10)
		if err != nil || len(got) != 2 || !sameMsg(got[0], one) || !sameMsg(got[1], two) {
			t.Errorf("%s: Messages = %+v, %v; want %+v and %+v", when, got, err, one, two)
		}
	}
	check("before reopen")
	e.reopen(t)
	check("after reopen")
	retry, err := e.s.Append(ctx, store.Append{Msg: e.msg(1, "alice", "m1", "retry")})
	if err != nil || !retry.Duplicate || !sameMsg(retry.Msg, one) {
		t.Errorf("retry = %+v, %v; want Duplicate of %+v", retry, err, one)
	}
}
