package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

func apnsReg(user, device, token string, at int64) store.PushReg {
	return store.PushReg{UserID: user, DeviceID: device, Provider: "apns", Token: token, Topic: "im.parley.app", Sandbox: true, UpdatedAt: at}
}

func pushTokens(regs []store.PushReg) []string {
	out := []string{}
	for _, r := range regs {
		out = append(out, r.DeviceID+"/"+r.Provider+"/"+r.Token)
	}
	return out
}

// testPushRegistrations: registrations of every provider are stored and
// listed by device, provider and token (Web Push keys kept); registering a
// token again replaces it; the per-device bound holds for new tokens
// only; a token registered by another user moves to them (returned as
// moved); removal by token and by device, RemoveDevice, and PushDrop's
// guard on a registration made since; everything survives a reopen.
func testPushRegistrations(t *testing.T, e *env) {
	ctx := context.Background()
	p256 := make([]byte, 65)
	p256[0] = 4
	auth := []byte("0123456789abcdef")
	regs := []store.PushReg{
		apnsReg("alice", "phone", "aa01", 1),
		{UserID: "alice", DeviceID: "phone", Provider: "fcm", Token: "fcm:tok-1", UpdatedAt: 2},
		{UserID: "alice", DeviceID: "laptop", Provider: "webpush", Token: "https://push.example/ep/1", P256dh: p256, Auth: auth, UpdatedAt: 3},
	}
	for _, r := range regs {
		if moved, err := e.s.PushRegister(ctx, r, 2); err != nil || moved != nil {
			t.Fatalf("register %s: moved %v, %v", r.Token, moved, err)
		}
	}
	got, err := e.s.PushRegs(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	want := []store.PushReg{regs[2], regs[0], regs[1]} // laptop < phone; apns < fcm
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("alice's registrations:\n got %+v\nwant %+v", got, want)
	}
	// A third token on phone is over the bound of 2; the same token again
	// (a refresh) is not.
	if _, err := e.s.PushRegister(ctx, apnsReg("alice", "phone", "aa02", 4), 2); !errors.Is(err, store.ErrTooMany) {
		t.Fatalf("third registration of a device: %v, want ErrTooMany", err)
	}
	refreshed := apnsReg("alice", "phone", "aa01", 5)
	refreshed.Sandbox = false
	if moved, err := e.s.PushRegister(ctx, refreshed, 2); err != nil || moved != nil {
		t.Fatalf("refresh: moved %v, %v", moved, err)
	}
	if got, _ := e.s.PushRegs(ctx, "alice"); len(got) != 3 || !reflect.DeepEqual(got[1], refreshed) {
		t.Fatalf("after refresh: %+v", got)
	}
	// Bob's phone registers alice's APNs token: it is unbound from her.
	moved, err := e.s.PushRegister(ctx, apnsReg("bob", "phone", "aa01", 6), 2)
	if err != nil || moved == nil || moved.UserID != "alice" || moved.DeviceID != "phone" || moved.UpdatedAt != 5 {
		t.Fatalf("token moved to bob: moved %+v, %v", moved, err)
	}
	if got, _ := e.s.PushRegs(ctx, "alice"); !reflect.DeepEqual(pushTokens(got), []string{"laptop/webpush/https://push.example/ep/1", "phone/fcm/fcm:tok-1"}) {
		t.Fatalf("alice after the move: %v", pushTokens(got))
	}
	if got, _ := e.s.PushRegs(ctx, "bob"); !reflect.DeepEqual(pushTokens(got), []string{"phone/apns/aa01"}) {
		t.Fatalf("bob after the move: %v", pushTokens(got))
	}
	// Alice's phone may now take a new token (it holds one).
	if _, err := e.s.PushRegister(ctx, apnsReg("alice", "phone", "aa03", 7), 2); err != nil {
		t.Fatalf("registration after a move freed a place: %v", err)
	}
	// Removing a token the device no longer holds changes nothing of the
	// holder's.
	if err := e.s.PushRemove(ctx, "alice", "phone", "apns", "aa01"); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.s.PushRegs(ctx, "bob"); len(got) != 1 {
		t.Fatalf("alice's removal of a moved token removed bob's: %v", pushTokens(got))
	}
	// PushDrop leaves a registration made after the rejected send.
	if err := e.s.PushDrop(ctx, "apns", "aa01", 5); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.s.PushRegs(ctx, "bob"); len(got) != 1 {
		t.Fatalf("PushDrop before the registration removed it: %v", pushTokens(got))
	}
	if err := e.s.PushDrop(ctx, "apns", "aa01", 6); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.s.PushRegs(ctx, "bob"); len(got) != 0 {
		t.Fatalf("PushDrop kept: %v", pushTokens(got))
	}
	if err := e.s.PushRemove(ctx, "alice", "phone", "fcm", "fcm:tok-1"); err != nil {
		t.Fatal(err)
	}
	e.reopen(t)
	if got, _ := e.s.PushRegs(ctx, "alice"); !reflect.DeepEqual(pushTokens(got), []string{"laptop/webpush/https://push.example/ep/1", "phone/apns/aa03"}) {
		t.Fatalf("alice after reopen: %v", pushTokens(got))
	}
	// The token index follows removals: aa03 registered by bob moves
	// from alice, fcm:tok-1 (removed) binds bob without a move.
	if moved, err := e.s.PushRegister(ctx, store.PushReg{UserID: "bob", DeviceID: "tab", Provider: "fcm", Token: "fcm:tok-1", UpdatedAt: 8}, 2); err != nil || moved != nil {
		t.Fatalf("a removed token registered again: moved %+v, %v", moved, err)
	}
	// RemoveDevice drops the device's registrations (with or without keys).
	if err := e.s.RemoveDevice(ctx, "alice", "laptop"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.PushRemove(ctx, "alice", "phone", "", ""); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.s.PushRegs(ctx, "alice"); len(got) != 0 {
		t.Fatalf("alice after RemoveDevice and removing every phone token: %v", pushTokens(got))
	}
	if moved, err := e.s.PushRegister(ctx, apnsReg("bob", "phone", "aa03", 9), 2); err != nil || moved != nil {
		t.Fatalf("a token of a removed device is free: moved %+v, %v", moved, err)
	}
	// Bad arguments never reach the engine's data.
	for _, bad := range []store.PushReg{
		apnsReg("bad user", "phone", "aa", 1),
		apnsReg("bob", "phone", "two words", 1),
		{UserID: "bob", DeviceID: "phone", Provider: "gcm", Token: "x"},
		apnsReg("bob", "phone", string(make([]byte, 5000)), 1),
	} {
		if _, err := e.s.PushRegister(ctx, bad, 2); err == nil || errors.Is(err, store.ErrTooMany) {
			t.Errorf("register %q/%q/%.10q: %v, want an argument error", bad.UserID, bad.Provider, bad.Token, err)
		}
	}
	if got, _ := e.s.PushRegs(ctx, "bob"); !reflect.DeepEqual(pushTokens(got), []string{"phone/apns/aa03", "tab/fcm/fcm:tok-1"}) {
		t.Fatalf("bob at the end: %v", pushTokens(got))
	}
}

// testPushConcurrent: devices registering and removing their own tokens
// at once keep exactly their own.
func testPushConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	errs := make(chan error, 16)
	for d := range 16 {
		go func() {
			dev := fmt.Sprintf("d%02d", d)
			for i := range 6 {
				r := store.PushReg{UserID: "carol", DeviceID: dev, Provider: "fcm", Token: fmt.Sprintf("%s-%d", dev, i), UpdatedAt: int64(i + 1)}
				if _, err := e.s.PushRegister(ctx, r, 4); err != nil {
					errs <- err
					return
				}
				if i%2 == 1 {
					if err := e.s.PushRemove(ctx, "carol", dev, "fcm", fmt.Sprintf("%s-%d", dev, i-1)); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got, err := e.s.PushRegs(ctx, "carol")
	if err != nil || len(got) != 16*3 {
		t.Fatalf("carol's registrations: %d, %v; want %d", len(got), err, 16*3)
	}
	for _, r := range got {
		var i int
		if _, err := fmt.Sscanf(r.Token[len(r.DeviceID)+1:], "%d", &i); err != nil || i%2 == 0 {
			t.Errorf("registration %s kept (removed ones are even)", r.Token)
		}
	}
}
