package clustertest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/cluster/lease"
	"github.com/parley-im/parley/protocol"
)

// TestDeliveredPositionsAcrossPartitions: one delivered frame with the
// positions of conversations in several partitions (the gateway sends
// each partition's to its owner) raises every one of them: each direct
// peer gets its delivered receipt, and the frame is answered once, ok.
func TestDeliveredPositionsAcrossPartitions(t *testing.T) {
	c := Start(t, Options{Gateways: 1, Chats: 2})
	g := c.Gateways[0]
	bob := dialWait(t, c, g, "bob")
	defer bob.close()
	var (
		peers     []*rawConn
		positions []protocol.Position
		parts     = map[int]bool{}
	)
	for i := 0; len(peers) < 8; i++ {
		name := fmt.Sprintf("peer%d", i)
		p := dialWait(t, c, g, name)
		defer p.close()
		r, err := p.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}, 20*time.Second)
		if err != nil || r.Conv == nil {
			t.Fatalf("%s open_direct: %v %+v", name, err, r)
		}
		a, err := p.call(protocol.Frame{Type: protocol.TypeSend, ConvID: r.Conv.ConvID, ClientMsgID: "m1", Body: "hi"}, 20*time.Second)
		if err != nil || a.Type != protocol.TypeAck {
			t.Fatalf("%s send: %v %+v", name, err, a)
		}
		peers = append(peers, p)
		positions = append(positions, protocol.Position{ConvID: r.Conv.ConvID, Seq: a.Seq})
		parts[lease.Partition(r.Conv.ConvID, lease.DefaultPartitions)] = true
	}
	if len(parts) < 2 {
		t.Fatalf("the %d conversations fell in %d partition; the test needs several", len(positions), len(parts))
	}
	r, err := bob.call(protocol.Frame{Type: protocol.TypeDelivered, Positions: positions}, 20*time.Second)
	if err != nil || r.Type != protocol.TypeOK {
		t.Fatalf("delivered positions: %v %+v", err, r)
	}
	for i, p := range peers {
		if err := waitReceipt(p, positions[i]); err != nil {
			t.Fatalf("peer%d: %v", i, err)
		}
	}
}

// dialWait connects user to g, retrying while the cluster starts.
func dialWait(t *testing.T, c *Cluster, g *Proc, user string) *rawConn {
	t.Helper()
	var err error
	for range 60 {
		var r *rawConn
		if r, err = dialRaw(c, g, user, "d"); err == nil {
			return r
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatal(err)
	return nil
}

// waitReceipt reads r's pushes until the delivered receipt of p arrives.
func waitReceipt(r *rawConn, p protocol.Position) error {
	_ = r.ws.SetReadDeadline(time.Now().Add(15 * time.Second))
	for {
		_, data, err := r.ws.ReadMessage()
		if err != nil {
			return fmt.Errorf("no delivered receipt of %+v: %w", p, err)
		}
		var f protocol.Frame
		if err := json.Unmarshal(data, &f); err != nil {
			return err
		}
		if f.Type == protocol.TypeReceipt && f.State == protocol.StateDelivered && f.ConvID == p.ConvID && f.Seq == p.Seq && f.UserID == "bob" {
			return nil
		}
	}
}
