package route

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/protocol"
)

// TestWriteToGivenUpPartitionAnsweredMoved: a write that reaches a chat
// process in the moment after it gave its partition up (the lease
// released, the subscription not yet gone) is answered "moved", which the
// gateway retries on the new owner, instead of going unanswered until the
// request's timeout.
func TestWriteToGivenUpPartitionAnsweredMoved(t *testing.T) {
	srv := enginetest.NATS(t, 0, t.TempDir())
	nc, err := natsio.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := lease.OpenKVStore(ctx, nc, lease.KVConfig{Bucket: "handover"})
	if err != nil {
		t.Fatal(err)
	}
	owner := lease.NewOwner(st, lease.OwnerConfig{Node: "n1", Partitions: 1, LeaseTTL: 3 * time.Second})
	const ns = "t"
	raw, _ := json.Marshal(protocol.Frame{Type: protocol.TypeSend, RID: "r1", ConvID: 42, ClientMsgID: "m1", Body: "hi"})
	data, _ := json.Marshal(request{User: "alice", Device: "d1", Frame: raw})

	// Registered before Serve's own watcher, so it runs while the
	// partition's subscription is still there.
	var (
		mu     sync.Mutex
		answer *natsio.Msg
		rerr   error
		done   = make(chan struct{})
		once   sync.Once
	)
	owner.Watch(func(p int, held bool) {
		if held {
			return
		}
		once.Do(func() {
			m, err := nc.Request(subjectPart(ns, p), data, 5*time.Second)
			mu.Lock()
			answer, rerr = m, err
			mu.Unlock()
			close(done)
		})
	})
	// The service is never reached: the process does not own the write.
	served := make(chan error, 1)
	go func() {
		served <- Serve(ctx, ServeConfig{Conn: nc, Namespace: ns, Service: &chat.Service{}, Owner: owner})
	}()
	octx, ocancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { owner.Run(octx); close(ran) }()
	deadline := time.Now().Add(10 * time.Second)
	for !owner.Holds(0) {
		if time.Now().After(deadline) {
			t.Fatal("the partition was not taken within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ocancel() // gives the partition up
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher never ran")
	}
	<-ran
	mu.Lock()
	defer mu.Unlock()
	if rerr != nil {
		t.Fatalf("the write to the given-up partition: %v (want a moved answer)", rerr)
	}
	if answer.Header.Get(headerMoved) == "" {
		t.Fatalf("answer without the %s header: %s", headerMoved, answer.Data)
	}
	var f protocol.Frame
	if err := json.Unmarshal(answer.Data, &f); err != nil {
		t.Fatal(err)
	}
	if f.Type != protocol.TypeError || f.Code != protocol.CodeOverloaded || f.Error != chat.MovingMsg || f.RID != "r1" {
		t.Fatalf("answer %+v, want overloaded %q for r1", f, chat.MovingMsg)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
