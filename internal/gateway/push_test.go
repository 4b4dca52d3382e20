package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// recorder is a transport that keeps what was written, call by call.
type recorder struct {
	mu    sync.Mutex
	calls [][]string // payloads per write call
}

func (r *recorder) write(f *wireFrame) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, []string{string(f.payload())})
	return nil
}

func (r *recorder) writeMany(ms []*message, buf []byte) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var call []string
	for _, m := range ms {
		call = append(call, string(m.frame.payload()))
	}
	r.calls = append(r.calls, call)
	return buf, nil
}

func (r *recorder) close(int, string) {}

func testGateway(t *testing.T) *Gateway {
	t.Helper()
	g := &Gateway{cfg: DefaultConfig(), now: time.Now, log: slog.New(slog.DiscardHandler)}
	for i := range g.shards {
		g.shards[i].users = make(map[string][]*session)
	}
	return g
}

func (g *Gateway) testSession(user string) (*session, *recorder) {
	r := &recorder{}
	s := g.newSession(user, "d", r)
	s.greeted.Store(true)
	g.add(s)
	return s, r
}

func msg(conv, seq uint64) queued {
	return queued{m: &message{frame: newWireFrame([]byte(fmt.Sprintf(`{"c":%d,"s":%d}`, conv, seq))), conv: conv, seq: seq}}
}

// TestBatchWritesEachConnectionItsFramesInOrderOnce: a batch of queued
// deliveries reaches every connection as one write holding its frames in
// the order the deliveries were queued, whether the deliveries share
// their recipients or not; every message push is tracked for its ack.
func TestBatchWritesEachConnectionItsFramesInOrderOnce(t *testing.T) {
	g := testGateway(t)
	a, ra := g.testSession("a")
	b, rb := g.testSession("b")
	_, rb2 := g.testSession("b") // a second device of b
	_, rc := g.testSession("c")

	// Same recipients for all: one walk with all frames.
	var batch []queued
	for seq := uint64(1); seq <= 3; seq++ {
		q := msg(7, seq)
		q.users = []string{"a", "b"}
		batch = append(batch, q)
	}
	g.writeBatch(batch)
	for name, r := range map[string]*recorder{"a": ra, "b": rb, "b2": rb2} {
		if got := fmt.Sprint(r.calls); got != `[[{"c":7,"s":1} {"c":7,"s":2} {"c":7,"s":3}]]` {
			t.Fatalf("%s got %s, want the three frames in one write", name, got)
		}
	}
	if len(rc.calls) != 0 {
		t.Fatalf("c is not a recipient and got %v", rc.calls)
	}
	if len(a.mu.inflight) != 3 || len(b.mu.inflight) != 3 {
		t.Fatalf("tracked %d and %d pushes, want 3 each", len(a.mu.inflight), len(b.mu.inflight))
	}
	a.ack(7, 2)
	if len(a.mu.inflight) != 1 || a.mu.inflight[0].m.seq != 3 {
		t.Fatalf("after ack 2: %d tracked, want seq 3 only", len(a.mu.inflight))
	}

	// Different recipients per delivery: grouped per user, order kept.
	ra.calls, rb.calls, rb2.calls = nil, nil, nil
	q1, q2, q3 := msg(8, 1), msg(9, 1), msg(8, 2)
	q1.users, q2.users, q3.users = []string{"a", "c"}, []string{"c"}, []string{"c", "a", "b"}
	g.writeBatch([]queued{q1, q2, q3})
	want := map[string]string{
		"a": `[[{"c":8,"s":1} {"c":8,"s":2}]]`,
		"b": `[[{"c":8,"s":2}]]`,
		"c": `[[{"c":8,"s":1} {"c":9,"s":1} {"c":8,"s":2}]]`,
	}
	for name, r := range map[string]*recorder{"a": ra, "b": rb, "c": rc} {
		if got := fmt.Sprint(r.calls); got != want[name] {
			t.Fatalf("%s got %s, want %s", name, got, want[name])
		}
	}
}

// TestDispatcherKeepsDeliveryOrderPerConnection: deliveries queued by
// concurrent publishers reach a connection in queue order, all of them,
// through the dispatcher's batches (large ones split over the cores).
func TestDispatcherKeepsDeliveryOrderPerConnection(t *testing.T) {
	g := testGateway(t)
	users := make([]string, 3*deliverChunk)
	recs := make([]*recorder, len(users))
	for i := range users {
		users[i] = "u" + strconv.Itoa(i)
		_, recs[i] = g.testSession(users[i])
	}
	g.pushes = make(chan queued, pushQueueLen)
	g.ctx, g.cancel = contextWithCancel()
	g.sweeper.Add(1)
	go g.dispatch()
	const n = 300
	for seq := uint64(1); seq <= n; seq++ {
		q := msg(1, seq)
		q.users = users
		g.pushes <- q
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, r := range recs {
		for {
			r.mu.Lock()
			var got []string
			for _, c := range r.calls {
				got = append(got, c...)
			}
			r.mu.Unlock()
			if len(got) == n {
				for j, p := range got {
					if want := fmt.Sprintf(`{"c":1,"s":%d}`, j+1); p != want {
						t.Fatalf("user %d frame %d = %s, want %s", i, j, p, want)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("user %d got %d of %d frames", i, len(got), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	g.cancel()
	g.sweeper.Wait()
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// TestUntrackedPushesAreWrittenNeverResent: a large group's pushes reach
// the connection, alone or in a batch beside tracked ones, but only the
// tracked ones wait for an ack and come back in a re-send.
func TestUntrackedPushesAreWrittenNeverResent(t *testing.T) {
	g := testGateway(t)
	s, r := g.testSession("a")
	big := func(seq uint64) queued {
		q := msg(9, seq)
		q.m.untracked = true
		q.users = []string{"a"}
		return q
	}
	small := msg(7, 1)
	small.users = []string{"a"}
	g.writeBatch([]queued{big(1)})
	g.writeBatch([]queued{big(2), small, big(3)})
	if got := fmt.Sprint(r.calls); got != `[[{"c":9,"s":1}] [{"c":9,"s":2} {"c":7,"s":1} {"c":9,"s":3}]]` {
		t.Fatalf("writes: %s", got)
	}
	if n := len(s.mu.inflight); n != 1 || s.mu.inflight[0].m.conv != 7 {
		t.Fatalf("tracked: %+v, want only conv 7's push", s.mu.inflight)
	}
	r.calls = nil
	later := g.now().Add(time.Hour).UnixMilli()
	s.retransmit(later, later)
	if got := fmt.Sprint(r.calls); got != `[[{"c":7,"s":1}]]` {
		t.Fatalf("re-sent: %s, want only the tracked push", got)
	}
}

// TestDeliveredPositionsAckAcrossConversations: one delivered frame with
// several positions acknowledges the tracked pushes of each conversation
// up to its seq, and nothing beyond.
func TestDeliveredPositionsAckAcrossConversations(t *testing.T) {
	g := testGateway(t)
	s, _ := g.testSession("a")
	var batch []queued
	for _, cs := range [][2]uint64{{1, 1}, {2, 1}, {1, 2}, {3, 5}, {2, 2}} {
		q := msg(cs[0], cs[1])
		q.users = []string{"a"}
		batch = append(batch, q)
	}
	g.writeBatch(batch)
	f, perr := protocol.DecodeClient([]byte(`{"type":"delivered","positions":[{"conv_id":"1","seq":2},{"conv_id":"2","seq":1},{"conv_id":"3","seq":4}]}`), protocol.DefaultLimits)
	if perr != nil {
		t.Fatal(perr)
	}
	s.ackMany(f.Positions)
	var left []string
	for _, p := range s.mu.inflight {
		left = append(left, fmt.Sprintf("%d/%d", p.m.conv, p.m.seq))
	}
	if got := fmt.Sprint(left); got != "[3/5 2/2]" {
		t.Fatalf("still tracked: %s, want [3/5 2/2]", got)
	}
}
