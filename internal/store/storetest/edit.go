package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// event returns an edit or recall event of target with the given check.
func (e *env) event(conv, target uint64, kind, body string, check func(store.Message) (store.Message, error)) store.Append {
	m := e.msg(conv, "alice", "", body)
	m.Kind, m.TargetSeq = kind, target
	return store.Append{Msg: m, Check: check}
}

func testEdit(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	orig := e.send(t, 1, "alice", 2)[0]
	var seen store.Message
	ev, err := e.s.Append(ctx, e.event(1, 1, "edit", "new text", func(target store.Message) (store.Message, error) {
		seen = target
		target.Body, target.Edited = "new text", true
		return target, nil
	}))
	if err != nil {
		t.Fatalf("Append(edit): %v", err)
	}
	if !sameMsg(seen, orig) {
		t.Errorf("Check got target %+v, want %+v", seen, orig)
	}
	if ev.Msg.Seq != 3 || ev.Msg.TargetSeq != 1 || ev.Msg.Kind != "edit" {
		t.Errorf("edit event = %+v, want seq 3 targeting 1", ev.Msg)
	}
	msgs, err := e.s.Messages(ctx, 1, 1, 3, 10)
	if err != nil || len(msgs) != 3 {
		t.Fatalf("Messages = %v, %v; want 1..3", seqs(msgs), err)
	}
	want := orig
	want.Body, want.Edited = "new text", true
	if !sameMsg(msgs[0], want) {
		t.Errorf("target after edit = %+v, want %+v", msgs[0], want)
	}
	if !sameMsg(msgs[2], ev.Msg) {
		t.Errorf("stored event = %+v, want %+v", msgs[2], ev.Msg)
	}
	// A second edit sees the first one's result.
	_, err = e.s.Append(ctx, e.event(1, 1, "edit", "third", func(target store.Message) (store.Message, error) {
		seen = target
		target.Body = "third"
		return target, nil
	}))
	if err != nil || !sameMsg(seen, want) {
		t.Errorf("second edit: Check got %+v (err %v), want %+v", seen, err, want)
	}
}

func testRecall(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	orig := e.send(t, 1, "alice", 1)[0]
	_, err := e.s.Append(ctx, e.event(1, 1, "recall", "", func(target store.Message) (store.Message, error) {
		target.Body, target.Recalled = "", true
		return target, nil
	}))
	if err != nil {
		t.Fatalf("Append(recall): %v", err)
	}
	msgs, err := e.s.Latest(ctx, 1, 0, 0, 2)
	if err != nil || len(msgs) != 2 {
		t.Fatalf("Latest = %v, %v; want 1..2", seqs(msgs), err)
	}
	want := orig
	want.Body, want.Recalled = "", true
	if !sameMsg(msgs[0], want) {
		t.Errorf("target after recall = %+v, want %+v", msgs[0], want)
	}
	if msgs[1].TargetSeq != 1 || msgs[1].Kind != "recall" {
		t.Errorf("recall event = %+v, want kind recall targeting 1", msgs[1])
	}
}

var errRefused = errors.New("storetest: refused")

func testEditRefused(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	orig := e.send(t, 1, "alice", 1)[0]
	_, err := e.s.Append(ctx, e.event(1, 1, "edit", "nope", func(store.Message) (store.Message, error) {
		return store.Message{}, errRefused
	}))
	wantErr(t, "refused edit", err, errRefused)
	_, err = e.s.Append(ctx, e.event(1, 7, "edit", "nope", func(target store.Message) (store.Message, error) {
		t.Errorf("Check called for a missing target (%+v)", target)
		return target, nil
	}))
	wantErr(t, "edit of a missing target", err, store.ErrNotFound)
	if got := e.lastSeq(t, 1); got != 1 {
		t.Errorf("LastSeq after refused edits = %d, want 1", got)
	}
	msgs, err := e.s.Messages(ctx, 1, 1, 10, 10)
	if err != nil || len(msgs) != 1 || !sameMsg(msgs[0], orig) {
		t.Errorf("Messages after refused edits = %+v, %v; want only the untouched original", msgs, err)
	}
	// The refusal consumed no seq.
	next := e.send(t, 1, "alice", 1)[0]
	if next.Seq != 2 {
		t.Errorf("next append after refusals got seq %d, want 2", next.Seq)
	}
}
