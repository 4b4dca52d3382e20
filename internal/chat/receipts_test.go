package chat

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/bus/local"
	"github.com/parley-im/parley/internal/ledger"
	lpebble "github.com/parley-im/parley/internal/ledger/pebble"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/registry/memory"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// receiptRig is a service on an in-memory store whose pushes to node n1
// are collected.
type receiptRig struct {
	t    *testing.T
	st   store.Store
	led  ledger.Ledger
	reg  registry.Registry
	b    bus.Bus
	mu   sync.Mutex
	seen []protocol.Frame // receipts pushed, in order
	node uint16           // Snowflake node of the last service started
}

func newReceiptRig(t *testing.T) *receiptRig {
	t.Helper()
	ctx := context.Background()
	st, err := pebble.Open(ctx, pebble.Config{Dir: "db", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	led, err := lpebble.Open(lpebble.Config{Dir: "ledger", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	r := &receiptRig{t: t, st: st, led: led, reg: memory.New(), b: local.New()}
	cancel, err := r.b.Subscribe(ctx, "n1", func(d bus.Delivery) error {
		var f protocol.Frame
		if err := json.Unmarshal(d.Frame, &f); err != nil {
			t.Errorf("push does not decode: %v", err)
			return nil
		}
		if f.Type == protocol.TypeReceipt {
			r.mu.Lock()
			r.seen = append(r.seen, f)
			r.mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	for _, u := range []string{"a", "b"} {
		if _, err := r.reg.Register(ctx, registry.Entry{User: u, Device: "d", Node: "n1", Session: u}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// service starts a service on the rig's store: a second call stands for
// a restarted process, with nothing in memory.
func (r *receiptRig) service() *Service {
	// Each service is a process of its own, with its own Snowflake node:
	// a restarted process reusing the node within the same millisecond
	// could mint an id the first one already used.
	r.node++
	return newService(r.t, DefaultConfig(), r.st, r.reg, r.b, r.led, r.node)
}

func (r *receiptRig) call(svc *Service, user string, f *protocol.Frame) *protocol.Frame {
	var got *protocol.Frame
	svc.Handle(context.Background(), Caller{User: user, Device: "d"}, f, func(resp *protocol.Frame) { got = resp })
	return got
}

// receipts returns and forgets the receipts pushed so far.
func (r *receiptRig) receipts() []protocol.Frame {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.seen
	r.seen = nil
	return out
}

func (r *receiptRig) expectReceipts(what string, seqs ...uint64) {
	r.t.Helper()
	got := r.receipts()
	if len(got) != len(seqs) {
		r.t.Fatalf("%s: %d receipts %+v, want seqs %v", what, len(got), got, seqs)
	}
	for i, f := range got {
		if f.Seq != seqs[i] || f.State != protocol.StateDelivered || f.UserID != "b" || f.DeviceID != "d" {
			r.t.Fatalf("%s: receipt %d is %+v, want b/d delivered seq %d", what, i, f, seqs[i])
		}
	}
}

// TestDeliveredPositionsInMemory: delivered acks raise an in-memory
// position and send the direct peer one receipt per raise (clamped to the
// last seq); repeated and lower acks cost nothing; FlushPositions persists
// them, and a restarted service starts from what was persisted. Losing
// the unflushed positions (a crash) only repeats a receipt.
func TestDeliveredPositionsInMemory(t *testing.T) {
	ctx := context.Background()
	r := newReceiptRig(t)
	svc := r.service()
	open := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"})
	if open == nil || open.Conv == nil {
		t.Fatalf("open_direct answered %+v", open)
	}
	conv := open.Conv.ConvID
	for i, body := range []string{"1", "2", "3"} {
		ack := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "m" + body, Kind: protocol.KindText, Body: body})
		if ack == nil || ack.Type != protocol.TypeAck || ack.Seq != uint64(i+1) {
			t.Fatalf("send %d answered %+v", i, ack)
		}
	}
	r.receipts()

	delivered := func(svc *Service, user string, seq uint64) *protocol.Frame {
		return r.call(svc, user, &protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: seq})
	}
	if resp := delivered(svc, "b", 2); resp != nil {
		t.Fatalf("delivered without rid answered %+v", resp)
	}
	r.expectReceipts("first ack", 2)
	delivered(svc, "b", 2)
	delivered(svc, "b", 1)
	r.expectReceipts("repeated and lower acks")
	delivered(svc, "b", 99)
	r.expectReceipts("ack beyond the last seq", 3)
	if resp := delivered(svc, "c", 1); resp == nil || resp.Code != protocol.CodeNotMember {
		t.Fatalf("a non-member's ack answered %+v, want not_member", resp)
	}
	if resp := r.call(svc, "b", &protocol.Frame{Type: protocol.TypeDelivered, RID: "r1", ConvID: conv, Seq: 3}); resp == nil || resp.Type != protocol.TypeOK {
		t.Fatalf("delivered with rid answered %+v, want ok", resp)
	}

	// Persisted only in batches.
	if got, err := r.st.Delivered(ctx, "b", conv); err != nil || got != 0 {
		t.Fatalf("stored position before the flush = %d, %v; want 0", got, err)
	}
	if err := svc.FlushPositions(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := r.st.Delivered(ctx, "b", conv); err != nil || got != 3 {
		t.Fatalf("stored position after the flush = %d, %v; want 3", got, err)
	}

	// A restarted process starts from the stored position.
	svc2 := r.service()
	delivered(svc2, "b", 3)
	r.expectReceipts("ack at the persisted position after a restart")
	ack := r.call(svc2, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "m4", Kind: protocol.KindText, Body: "4"})
	if ack == nil || ack.Seq != 4 {
		t.Fatalf("send answered %+v", ack)
	}
	r.receipts()
	delivered(svc2, "b", 4)
	r.expectReceipts("raise after a restart", 4)

	// A crash before the flush: the position falls back to 3, and the
	// device's next ack repeats the receipt. Nothing else is lost.
	svc3 := r.service()
	delivered(svc3, "b", 4)
	r.expectReceipts("ack after a crash lost the unflushed position", 4)
}

// TestFlushPositionsForgetsIdleEntries: an entry that is persisted and
// idle for positionIdle is dropped from memory; a raised one is kept.
func TestFlushPositionsForgetsIdleEntries(t *testing.T) {
	ctx := context.Background()
	r := newReceiptRig(t)
	svc := r.service()
	open := r.call(svc, "a", &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "b"})
	conv := open.Conv.ConvID
	r.call(svc, "a", &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "m", Kind: protocol.KindText, Body: "x"})
	r.call(svc, "b", &protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: 1})
	count := func() int {
		n := 0
		for i := range svc.pos.shards {
			sh := &svc.pos.shards[i]
			sh.mu.Lock()
			n += len(sh.m)
			sh.mu.Unlock()
		}
		return n
	}
	if count() != 1 {
		t.Fatalf("%d entries, want 1", count())
	}
	// Pretend the entry was last touched long ago: the flush persists it
	// (raised) and keeps it, the next one forgets it.
	for i := range svc.pos.shards {
		for _, e := range svc.pos.shards[i].m {
			e.touched -= 2 * positionIdle.Milliseconds()
		}
	}
	if err := svc.FlushPositions(ctx); err != nil {
		t.Fatal(err)
	}
	if count() != 1 {
		t.Fatalf("a raised entry was dropped before it was persisted")
	}
	if err := svc.FlushPositions(ctx); err != nil {
		t.Fatal(err)
	}
	if count() != 0 {
		t.Fatalf("%d entries after an idle flush, want 0", count())
	}
	if got, _ := r.st.Delivered(ctx, "b", conv); got != 1 {
		t.Fatalf("stored position %d, want 1", got)
	}
}
