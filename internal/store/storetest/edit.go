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

// editTo returns an edit event of target that sets its body.
func (e *env) editTo(conv, target uint64, body string) store.Append {
	return e.event(conv, target, "edit", body, func(t store.Message) (store.Message, error) {
		t.Body, t.Edited = body, true
		return t, nil
	})
}

func (e *env) recallOf(conv, target uint64) store.Append {
	return e.event(conv, target, "recall", "", func(t store.Message) (store.Message, error) {
		t.Body, t.Recalled = "", true
		return t, nil
	})
}

func (e *env) appendOK(t *testing.T, a store.Append) store.Message {
	t.Helper()
	res, err := e.s.Append(context.Background(), a)
	if err != nil {
		t.Fatalf("Append(%s of %d): %v", a.Msg.Kind, a.Msg.TargetSeq, err)
	}
	return res.Msg
}

// asOf reads conv's messages lo..hi as they were at seq at.
func (e *env) asOf(t *testing.T, conv, lo, hi, at uint64, latest bool) []store.Message {
	t.Helper()
	ctx := context.Background()
	var (
		msgs []store.Message
		err  error
	)
	if latest {
		msgs, err = e.s.Latest(ctx, conv, hi+1, lo, int(hi-lo+1))
	} else {
		msgs, err = e.s.Messages(ctx, conv, lo, hi, int(hi-lo+1))
	}
	if err != nil || !equalSeqs(seqs(msgs), span(lo, hi)) {
		t.Fatalf("messages %d..%d = %v, %v", lo, hi, seqs(msgs), err)
	}
	if err := e.s.AsOf(ctx, conv, at, msgs); err != nil {
		t.Fatalf("AsOf(%d): %v", at, err)
	}
	return msgs
}

// testEditAsOf: a message edited several times reads, as of any seq, with
// the body and edited flag of its last edit at or below that seq (a former
// member's view as of its leave_seq), on both read paths and after a
// reopen; untouched messages, events and messages above the seq are left
// as they are.
func testEditAsOf(t *testing.T, e *env) {
	e.group(t, 1, "alice")
	sent := e.send(t, 1, "alice", 2)       // 1: "body 0", 2: "body 1"
	e.appendOK(t, e.editTo(1, 1, "one"))   // 3
	e.appendOK(t, e.editTo(1, 2, "two"))   // 4
	e.appendOK(t, e.editTo(1, 1, "three")) // 5
	e.appendOK(t, e.editTo(1, 1, "four"))  // 6
	// An event without Check rewrites nothing and is no version.
	e.appendOK(t, e.event(1, 1, "edit", "ignored", nil)) // 7
	type view struct {
		body   string
		edited bool
	}
	want := map[uint64][2]view{ // as of → (message 1, message 2)
		1:   {{"body 0", false}, {"two", true}}, // message 2 is above 1: left as it is
		2:   {{"body 0", false}, {"body 1", false}},
		3:   {{"one", true}, {"body 1", false}},
		4:   {{"one", true}, {"two", true}},
		5:   {{"three", true}, {"two", true}},
		6:   {{"four", true}, {"two", true}},
		7:   {{"four", true}, {"two", true}},
		100: {{"four", true}, {"two", true}},
	}
	check := func(when string) {
		for at, w := range want {
			for _, latest := range []bool{false, true} {
				msgs := e.asOf(t, 1, 1, 7, at, latest)
				for i, v := range w {
					m := msgs[i]
					if m.Body != v.body || m.Edited != v.edited {
						t.Errorf("%s: message %d as of %d = %q edited %v, want %q edited %v", when, m.Seq, at, m.Body, m.Edited, v.body, v.edited)
					}
					o := sent[i]
					o.Body, o.Edited, m.Body, m.Edited = "", false, "", false
					if !sameMsg(m, o) {
						t.Errorf("%s: message %d as of %d changed beyond body and edited: %+v, want %+v", when, m.Seq, at, m, o)
					}
				}
				for _, ev := range msgs[2:] {
					if ev.Kind != "edit" || ev.Edited {
						t.Errorf("%s: event %d as of %d = %+v", when, ev.Seq, at, ev)
					}
				}
			}
		}
		// Messages above the seq are left as they are.
		msgs := e.asOf(t, 1, 1, 2, 0, false)
		if msgs[0].Body != "four" || msgs[1].Body != "two" {
			t.Errorf("%s: as of 0 (below the messages) = %q, %q; want them untouched", when, msgs[0].Body, msgs[1].Body)
		}
	}
	check("before reopen")
	e.reopen(t)
	check("after reopen")
}

// testRecallAsOf: a recall, whatever its seq, hides the message as of any
// seq — a recall deletes every body the message had, including the
// versions kept for edits; a refused rewrite leaves no version.
func testRecallAsOf(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice")
	e.send(t, 1, "alice", 2)
	e.appendOK(t, e.editTo(1, 1, "one")) // 3
	e.appendOK(t, e.editTo(1, 1, "two")) // 4
	e.appendOK(t, e.recallOf(1, 1))      // 5
	_, err := e.s.Append(ctx, e.event(1, 2, "edit", "nope", func(store.Message) (store.Message, error) {
		return store.Message{}, errRefused
	}))
	wantErr(t, "refused edit", err, errRefused)
	e.appendOK(t, e.editTo(1, 2, "edited after")) // 6
	for _, reopen := range []bool{false, true} {
		if reopen {
			e.reopen(t)
		}
		for _, at := range []uint64{1, 2, 3, 4, 5, 6} {
			msgs := e.asOf(t, 1, 1, 2, at, at%2 == 0)
			if m := msgs[0]; !m.Recalled || m.Body != "" {
				t.Errorf("reopen %v: recalled message as of %d = %q recalled %v edited %v, want recalled with no body", reopen, at, m.Body, m.Recalled, m.Edited)
			}
			want, edited := "body 1", false
			if at >= 6 || at < 2 { // as of 1, message 2 is left as it is
				want, edited = "edited after", true
			}
			if m := msgs[1]; m.Body != want || m.Edited != edited {
				t.Errorf("reopen %v: message 2 as of %d = %q edited %v, want %q edited %v", reopen, at, m.Body, m.Edited, want, edited)
			}
		}
	}
}
