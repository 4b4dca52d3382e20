package e2e

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestSlowConsumerIsDroppedOthersUnaffected: a device that stops reading
// while a group floods it is disconnected once its outbound queue is full;
// the senders and a healthy member are never slowed down or blocked, and
// the slow device catches up by sync after reconnecting.
func TestSlowConsumerIsDroppedOthersUnaffected(t *testing.T) {
	// These raw clients send no heartbeats, and a loaded -race run can take
	// longer than the default idle timeout: only the queue bound may close
	// a connection here.
	srv := servertest.Start(t, servertest.WithGateway(func(g *gateway.Config) {
		g.OutboundQueueBytes = 1 << 20
		g.IdleTimeout = 10 * time.Minute
	}))
	senders := []string{"s1", "s2", "s3"}
	owner := dialRaw(t, srv, "s1", "d")
	conv := mustOK(t, owner.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "flood", Members: []string{"s2", "s3", "slow", "healthy"}}), protocol.TypeConv).Conv.ConvID
	slow := dialRaw(t, srv, "slow", "d")
	healthy := dialRaw(t, srv, "healthy", "d")
	// slow stops reading; its socket buffers fill, then the server's queue.
	// A fixed small receive buffer keeps loopback autotuning (up to
	// tcp_rmem's 32 MiB here) from hiding the flood in the kernel.
	if err := slow.ws.UnderlyingConn().(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	slow.pause()

	const perSender = 600
	body := strings.Repeat("x", protocol.DefaultLimits.MaxBodyBytes)
	var wg sync.WaitGroup
	errs := make(chan error, len(senders))
	for i, u := range senders {
		c := owner
		if i > 0 {
			c = dialRaw(t, srv, u, "d")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < perSender; j++ {
				c.send(protocol.Frame{Type: protocol.TypeSend, RID: fmt.Sprint(j), ConvID: conv, ClientMsgID: fmt.Sprint(u, j), Body: body})
			}
			for j := 0; j < perSender; j++ {
				if f := c.nextTimeout(protocol.TypeAck, 60*time.Second); f == nil {
					errs <- fmt.Errorf("%s: ack %d never came", u, j)
					return
				}
			}
		}()
	}
	total := uint64(perSender * len(senders))
	// The healthy member reads everything meanwhile. Concurrent senders'
	// pushes may interleave out of seq order; clients reorder by seq.
	seen := make(map[uint64]bool, total)
	for uint64(len(seen)) < total {
		f := healthy.nextTimeout(protocol.TypeMsg, 60*time.Second)
		if f == nil {
			t.Fatalf("healthy member stalled after %d of %d messages", len(seen), total)
		}
		if s := f.Message.Seq; s == 0 || s > total {
			t.Fatalf("healthy member got seq %d, want 1..%d", s, total)
		}
		seen[f.Message.Seq] = true
	}
	healthy.send(protocol.Frame{Type: protocol.TypeDelivered, ConvID: conv, Seq: total})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The slow device was cut off.
	deadline := time.Now().Add(10 * time.Second)
	for {
		sessions := srv.Gateway().Connections()
		if sessions == len(senders)+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway holds %d connections, want %d (slow consumer dropped)", sessions, len(senders)+1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Reconnected, it syncs everything it missed.
	again := dialRaw(t, srv, "slow", "d2")
	r := mustOK(t, again.call(protocol.Frame{Type: protocol.TypeSync, All: true}), protocol.TypeSnapshot)
	if len(r.Snapshot) != 1 || r.Snapshot[0].LastSeq != total {
		t.Fatalf("slow device snapshot = %d convs, want 1 with last seq %d", len(r.Snapshot), total)
	}
}
