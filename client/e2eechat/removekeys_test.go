package e2eechat

import (
	"encoding/json"
	"testing"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestRemoveKeysThroughSDK: client.RemoveKeys (keys_remove) drops the
// device's keys from the directory, and its E2E contacts see a
// device_removed event.
func TestRemoveKeysThroughSDK(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 3)
	bob := startDev(t, srv, "bob", "phone", 3)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if devs, err := bob.c.KeyDevices(ctx, "alice"); err != nil || len(devs) != 1 {
		t.Fatalf("alice's devices before = %+v, %v", devs, err)
	}
	if err := alice.c.RemoveKeys(ctx); err != nil {
		t.Fatalf("RemoveKeys: %v", err)
	}
	if devs, err := bob.c.KeyDevices(ctx, "alice"); err != nil || len(devs) != 0 {
		t.Fatalf("alice's devices after RemoveKeys = %+v, %v", devs, err)
	}
	msgs, _, err := bob.c.History(ctx, conv.ConvID, client.HistoryQuery{Forward: true})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range msgs {
		var ev protocol.SystemEvent
		if m.Kind == protocol.KindSystem && json.Unmarshal([]byte(m.Body), &ev) == nil && ev.Event == "device_removed" && ev.Actor == "alice" && ev.Device == "phone" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no device_removed event in %+v", msgs)
	}
}
