// Package bustest is the conformance suite every bus.Bus engine must pass.
package bustest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/bus"
)

// Run runs the suite; open returns a fresh bus per subtest.
func Run(t *testing.T, open func(t *testing.T) bus.Bus) {
	ctx := context.Background()
	t.Run("RoutesToNode", func(t *testing.T) {
		b := open(t)
		got1, got2 := make(chan bus.Delivery, 4), make(chan bus.Delivery, 4)
		c1, err := b.Subscribe(ctx, "n1", func(d bus.Delivery) error { got1 <- d; return nil })
		if err != nil {
			t.Fatal(err)
		}
		defer c1()
		c2, err := b.Subscribe(ctx, "n2", func(d bus.Delivery) error { got2 <- d; return nil })
		if err != nil {
			t.Fatal(err)
		}
		defer c2()
		want := bus.Delivery{Users: []string{"a", "b"}, Frame: []byte(`{"type":"msg"}`), ConvID: 9, Seq: 3, Untracked: true}
		if err := b.Publish(ctx, "n2", want); err != nil {
			t.Fatal(err)
		}
		d := recv(t, got2)
		if string(d.Frame) != string(want.Frame) || len(d.Users) != 2 || d.ConvID != 9 || d.Seq != 3 || !d.Untracked {
			t.Fatalf("got %+v, want %+v", d, want)
		}
		select {
		case d := <-got1:
			t.Fatalf("n1 got %+v, want nothing", d)
		case <-time.After(50 * time.Millisecond):
		}
	})
	t.Run("KickTravels", func(t *testing.T) {
		b := open(t)
		got := make(chan bus.Delivery, 1)
		c, _ := b.Subscribe(ctx, "n1", func(d bus.Delivery) error { got <- d; return nil })
		defer c()
		if err := b.Publish(ctx, "n1", bus.Delivery{Kick: &bus.Kick{User: "u", Device: "d", Session: "s"}}); err != nil {
			t.Fatal(err)
		}
		if d := recv(t, got); d.Kick == nil || d.Kick.Session != "s" || d.Kick.Code != 0 {
			t.Fatalf("got %+v, want kick of session s", d)
		}
		// An operator's disconnect carries its close code.
		if err := b.Publish(ctx, "n1", bus.Delivery{Kick: &bus.Kick{User: "u", Device: "d", Code: 4004}}); err != nil {
			t.Fatal(err)
		}
		if d := recv(t, got); d.Kick == nil || d.Kick.User != "u" || d.Kick.Device != "d" || d.Kick.Code != 4004 {
			t.Fatalf("got %+v, want disconnect of u/d with 4004", d.Kick)
		}
	})
	t.Run("GroupTravels", func(t *testing.T) {
		b := open(t)
		got := make(chan bus.Delivery, 2)
		c, _ := b.Subscribe(ctx, "n1", func(d bus.Delivery) error {
			got <- d
			if d.Group != nil && !d.Group.Full {
				return bus.ErrStale // this node holds no list
			}
			return nil
		})
		defer c()
		full := bus.Delivery{Frame: []byte(`{}`), ConvID: 5, Seq: 8, Group: &bus.Group{List: "x.1", Full: true,
			Members: []bus.Member{{User: "a", JoinSeq: 2}, {User: "b", JoinSeq: 9}}}}
		if err := b.Publish(ctx, "n1", full); err != nil {
			t.Fatal(err)
		}
		d := recv(t, got)
		if d.Group == nil || d.Group.List != "x.1" || !d.Group.Full || len(d.Group.Members) != 2 || d.Group.Members[1] != (bus.Member{User: "b", JoinSeq: 9}) {
			t.Fatalf("got group %+v", d.Group)
		}
		// The handler's refusal reaches the publisher.
		err := b.Publish(ctx, "n1", bus.Delivery{Frame: []byte(`{}`), ConvID: 5, Seq: 9, Group: &bus.Group{List: "x.1"}})
		if !errors.Is(err, bus.ErrStale) {
			t.Fatalf("err = %v, want ErrStale", err)
		}
		recv(t, got)
	})
	t.Run("NoSubscriber", func(t *testing.T) {
		b := open(t)
		err := b.Publish(ctx, "nobody", bus.Delivery{Frame: []byte("x")})
		if !errors.Is(err, bus.ErrNoSubscriber) {
			t.Fatalf("err = %v, want ErrNoSubscriber", err)
		}
	})
	t.Run("ConcurrentPublish", func(t *testing.T) {
		b := open(t)
		var mu sync.Mutex
		n := 0
		done := make(chan struct{})
		c, _ := b.Subscribe(ctx, "n1", func(bus.Delivery) error {
			mu.Lock()
			n++
			if n == 800 {
				close(done)
			}
			mu.Unlock()
			return nil
		})
		defer c()
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 100; j++ {
					if err := b.Publish(ctx, "n1", bus.Delivery{Frame: []byte("x")}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("received %d of 800", n)
		}
	})
}

func recv(t *testing.T, ch chan bus.Delivery) bus.Delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery within 5s")
	}
	return bus.Delivery{}
}
