package storetest

import (
	"context"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// testReply: a message's ReplyTo is stored with it and kept through an
// edit and a recall of it (Check's rewrite cannot drop or change it), on
// every read path, also as of an earlier seq and after a reopen.
func testReply(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	e.send(t, 1, "alice", 1)
	m := e.msg(1, "alice", "r-1", "an answer")
	m.ReplyTo = 1
	res, err := e.s.Append(ctx, store.Append{Msg: m})
	if err != nil {
		t.Fatalf("Append(reply): %v", err)
	}
	if res.Msg.ReplyTo != 1 || res.Msg.Seq != 2 {
		t.Fatalf("stored reply = %+v, want seq 2 replying to 1", res.Msg)
	}
	// An edit whose Check tries to move the reference keeps it.
	_, err = e.s.Append(ctx, e.event(1, 2, "edit", "edited", func(target store.Message) (store.Message, error) {
		if target.ReplyTo != 1 {
			t.Errorf("Check got ReplyTo %d, want 1", target.ReplyTo)
		}
		target.Body, target.Edited, target.ReplyTo = "edited", true, 7
		return target, nil
	}))
	if err != nil {
		t.Fatalf("Append(edit): %v", err)
	}
	check := func(what string) {
		t.Helper()
		msgs, err := e.s.Messages(ctx, 1, 1, 3, 10)
		if err != nil || len(msgs) != 3 {
			t.Fatalf("%s: Messages = %v, %v; want 1..3", what, seqs(msgs), err)
		}
		if msgs[0].ReplyTo != 0 || msgs[1].ReplyTo != 1 || msgs[1].Body != "edited" || msgs[2].ReplyTo != 0 {
			t.Errorf("%s: messages = %+v, want 2 (edited) replying to 1, the others to nothing", what, msgs)
		}
		latest, err := e.s.Latest(ctx, 1, 0, 0, 2)
		if err != nil || len(latest) != 2 || latest[0].ReplyTo != 1 {
			t.Errorf("%s: Latest = %+v, %v; want seq 2 replying to 1 first", what, latest, err)
		}
		asOf := msgs[:2]
		if err := e.s.AsOf(ctx, 1, 2, asOf); err != nil || asOf[1].ReplyTo != 1 || asOf[1].Body != "an answer" {
			t.Errorf("%s: AsOf(2) = %+v, %v; want the reply as sent, still replying to 1", what, asOf, err)
		}
	}
	check("after the edit")
	e.reopen(t)
	check("after a reopen")
	// A retry of the reply (a new msg id, as a new request has) returns
	// the original, reference included.
	m.MsgID = e.msg(1, "alice", "", "").MsgID
	again, err := e.s.Append(ctx, store.Append{Msg: m})
	if err != nil || !again.Duplicate || again.Msg.ReplyTo != 1 {
		t.Errorf("repeated reply = %+v, %v; want the duplicate replying to 1", again, err)
	}
	_, err = e.s.Append(ctx, e.event(1, 2, "recall", "", func(target store.Message) (store.Message, error) {
		target.Body, target.Recalled, target.ReplyTo = "", true, 0
		return target, nil
	}))
	if err != nil {
		t.Fatalf("Append(recall): %v", err)
	}
	msgs, err := e.s.Messages(ctx, 1, 2, 2, 1)
	if err != nil || len(msgs) != 1 || !msgs[0].Recalled || msgs[0].ReplyTo != 1 {
		t.Errorf("recalled reply = %+v, %v; want recalled, still replying to 1", msgs, err)
	}
}
