package fanout

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/protocol"
)

// record hands failed work to the ledger; it outlives the fan-out's
// context, which may be ending.
func (f *Fanout) record(ctx context.Context, t ledger.Task) error {
	err := f.ledger.Record(context.WithoutCancel(ctx), t)
	if err != nil {
		f.log.Error("compensation ledger failed", "kind", t.Kind, "conv", t.Conv, "seq", t.Seq, "err", err)
	}
	return err
}

// Compensate redoes a recorded task (the ledger's handler); the ledger
// retries it until it returns nil. A push goes to the node it was meant
// for: one that has gone (no subscriber) is done, its users resync on
// whichever node they reconnect to.
func (f *Fanout) Compensate(ctx context.Context, t ledger.Task) error {
	f.compQuiet.RLock()
	defer f.compQuiet.RUnlock()
	var err error
	switch t.Kind {
	case ledger.KindRows:
		err = f.st.UpdateRows(ctx, t.Conv, t.Seq, t.Users, t.Mention)
	case ledger.KindPush:
		err = f.repush(ctx, t)
	default:
		f.log.Error("unknown compensation task dropped", "kind", t.Kind)
	}
	if err != nil {
		return err
	}
	if f.obs.Compensated != nil {
		f.obs.Compensated(t.Kind)
	}
	return nil
}

// repush pushes a task's message again to its node.
func (f *Fanout) repush(ctx context.Context, t ledger.Task) error {
	msgs, err := f.st.Messages(ctx, t.Conv, t.Seq, t.Seq, 1)
	if err != nil || len(msgs) != 1 {
		return err
	}
	wm := Wire(msgs[0])
	data, err := json.Marshal(&protocol.Frame{Type: protocol.TypeMsg, Message: &wm})
	if err != nil {
		return err
	}
	err = f.bus.Publish(ctx, t.Node, bus.Delivery{Users: t.Users, Frame: data, ConvID: t.Conv, Seq: t.Seq})
	if err != nil && !errors.Is(err, bus.ErrNoSubscriber) {
		return err
	}
	return nil
}

// Quiesce runs fn while no fan-out turn and no compensation is between its
// first effect and its last: turns in progress finish first, new ones wait
// until fn returns. Sends are not held (their messages wait in the
// outbox). A backup copies the store, the ledger and the webhook queue
// inside fn, so the copies agree: a message is either still in the
// outbox or has every row, task and event its fan-out recorded.
func (f *Fanout) Quiesce(fn func() error) error {
	f.out.quiet.Lock()
	defer f.out.quiet.Unlock()
	f.compQuiet.Lock()
	defer f.compQuiet.Unlock()
	return fn()
}
