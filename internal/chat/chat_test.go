package chat

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/bus/local"
	"github.com/parley-im/parley/internal/fanout"
	lpebble "github.com/parley-im/parley/internal/ledger/pebble"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/registry/memory"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

func TestTierFor(t *testing.T) {
	c := DefaultConfig() // 200 / 2000, hysteresis 0.1
	tests := []struct {
		cur  uint8
		n    int
		want uint8
	}{
		{0, 2, TierSmall}, {0, 199, TierSmall}, {0, 200, TierMedium}, {0, 2000, TierMedium}, {0, 2001, TierLarge},
		{TierSmall, 200, TierMedium}, {TierSmall, 5000, TierLarge},
		{TierMedium, 190, TierMedium}, {TierMedium, 179, TierSmall},
		{TierLarge, 1900, TierLarge}, {TierLarge, 1799, TierMedium}, {TierLarge, 10, TierSmall},
	}
	for _, tc := range tests {
		if got := c.tierFor(tc.cur, tc.n); got != tc.want {
			t.Errorf("tierFor(%s, %d) = %s, want %s", TierName(tc.cur), tc.n, TierName(got), TierName(tc.want))
		}
	}
}

// TestPushIsOneDeliveryPerNode: members spread over three gateway nodes get
// one bus delivery per node, carrying the message once with the node's
// local recipients.
func TestPushIsOneDeliveryPerNode(t *testing.T) {
	ctx := context.Background()
	st, err := pebble.Open(ctx, pebble.Config{Dir: "db", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	led, err := lpebble.Open(lpebble.Config{Dir: "ledger", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	reg, b := memory.New(), local.New()
	var mu sync.Mutex
	got := map[string][]bus.Delivery{}
	for _, n := range []string{"n1", "n2", "n3"} {
		cancel, _ := b.Subscribe(ctx, n, func(d bus.Delivery) {
			mu.Lock()
			got[n] = append(got[n], d)
			mu.Unlock()
		})
		defer cancel()
	}
	svc, err := New(DefaultConfig(), Deps{Store: st, Registry: reg, Bus: b, IDs: snowflake.New(1, nil),
		Online: fanout.NewOnline(st), Ledger: led})
	if err != nil {
		t.Fatal(err)
	}
	members := []string{"a", "b", "c", "d", "e", "f"}
	nodes := map[string]string{"a": "n1", "b": "n1", "c": "n2", "d": "n2", "e": "n3"} // f offline
	for u, n := range nodes {
		if _, err := reg.Register(ctx, registry.Entry{User: u, Device: "d", Node: n, Session: u}); err != nil {
			t.Fatal(err)
		}
	}
	var conv uint64
	svc.Handle(ctx, Caller{User: "a", Device: "d"}, &protocol.Frame{Type: protocol.TypeCreateGroup, Members: members[1:]}, func(f *protocol.Frame) { conv = f.Conv.ConvID })
	mu.Lock()
	clear(got)
	mu.Unlock()
	var ack *protocol.Frame
	svc.Handle(ctx, Caller{User: "a", Device: "d"}, &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: "x", Kind: protocol.KindText, Body: "hi"}, func(f *protocol.Frame) { ack = f })
	if ack == nil || ack.Type != protocol.TypeAck {
		t.Fatalf("send answered %+v", ack)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"n1": 2, "n2": 2, "n3": 1}
	for n, users := range want {
		if len(got[n]) != 1 || len(got[n][0].Users) != users || got[n][0].Seq != ack.Seq {
			t.Fatalf("node %s got %+v, want one delivery for %d users", n, got[n], users)
		}
	}
}
