package gateway

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestBlockingWriterBoundsBytesNotFrames: a reader that stops reading gets
// exactly as many bytes queued as the bound allows, counting the batch
// blocked in the socket, whatever the frame sizes; writes past it fail
// with errSlowConsumer instead of blocking the caller, and close(0) ends
// the connection even though a write is blocked on it.
func TestBlockingWriterBoundsBytesNotFrames(t *testing.T) {
	srv, cli := net.Pipe() // unbuffered: a Write blocks until read
	defer cli.Close()
	small, big := newWireFrame([]byte(`{"type":"msg"}`)), newWireFrame(bytes.Repeat([]byte("x"), 1000))
	w := newBlockingWriter(srv, 10*len(big.b))
	for i := 0; i < 10; i++ {
		if err := w.write(big); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if err := w.write(small); !errors.Is(err, errSlowConsumer) {
		t.Fatalf("write over the bound: %v, want errSlowConsumer", err)
	}
	w.close(0, "")
	if err := w.write(small); err == nil {
		t.Fatal("write after close succeeded")
	}
	// The reader sees at most the frames queued, then the end.
	got, err := io.ReadAll(cli)
	if err != nil && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(bytes.Repeat(big.b, 10), got) {
		t.Fatalf("reader got %d bytes, not a prefix of the queued frames", len(got))
	}
}

// TestBlockingWriterDeliversInOrderThenCloses: frames reach a reading
// client whole and in order, shared frames included, each one the bytes
// written; a close with a code follows them and the connection ends.
func TestBlockingWriterDeliversInOrderThenCloses(t *testing.T) {
	srv, cli := net.Pipe()
	defer cli.Close()
	shared := newWireFrame([]byte(`{"type":"msg"}`))
	frames := []*wireFrame{shared, newWireFrame(bytes.Repeat([]byte("y"), 70000)), shared, newWireFrame(nil)}
	w := newBlockingWriter(srv, 1<<20)
	var want []byte
	for _, f := range frames {
		if err := w.write(f); err != nil {
			t.Fatal(err)
		}
		want = append(want, f.b...)
	}
	w.close(4001, "replaced")
	if err := w.write(shared); err == nil {
		t.Fatal("write after close succeeded")
	}
	got, err := io.ReadAll(cli)
	if err != nil && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, want) {
		t.Fatalf("got %d bytes, want the %d bytes of the frames first", len(got), len(want))
	}
	fin, op, payload := parseFrame(t, got[len(want):])
	if !fin || op != 8 || len(payload) < 2 || binary.BigEndian.Uint16(payload) != 4001 || string(payload[2:]) != "replaced" {
		t.Fatalf("after the frames: fin %v opcode %d payload %q, want close 4001 replaced", fin, op, payload)
	}
}

func TestCloseFrameCutsLongReason(t *testing.T) {
	f := newCloseFrame(1001, string(bytes.Repeat([]byte("r"), 300)))
	fin, op, payload := parseFrame(t, f.b)
	if !fin || op != 8 || len(payload) != 125 {
		t.Fatalf("fin %v opcode %d payload %d bytes, want a final close of 125", fin, op, len(payload))
	}
}

// countingTransport records the frames written and reports a backlog.
type countingTransport struct {
	frames  []*wireFrame
	waiting int
}

func (c *countingTransport) write(f *wireFrame) error { c.frames = append(c.frames, f); return nil }
func (c *countingTransport) writeMany(ms []*message, buf []byte) ([]byte, error) {
	for _, m := range ms {
		c.frames = append(c.frames, m.frame)
	}
	return buf, nil
}
func (c *countingTransport) close(int, string) {}
func (c *countingTransport) backlog() int      { return c.waiting }

// TestRetransmitStaysWithinOutboundBudget: one sweep re-sends at most half
// the outbound queue, less what already waits, oldest first; the rest keep
// their tries and go out at later sweeps, so re-sends alone never make a
// reading device a slow consumer.
func TestRetransmitStaysWithinOutboundBudget(t *testing.T) {
	cfg := DefaultConfig()
	f := newWireFrame(bytes.Repeat([]byte("z"), 1000))
	cfg.OutboundQueueBytes = 10 * len(f.b)
	tr := &countingTransport{}
	s := &session{g: &Gateway{cfg: cfg}, tr: tr}
	s.greeted.Store(true)
	for seq := uint64(1); seq <= 20; seq++ {
		s.push([]*message{{frame: f, conv: 1, seq: seq}}, 0, nil)
	}
	tr.frames = nil
	resent := func(now int64) []uint64 {
		tr.frames = nil
		s.retransmit(1, now) // only pushes never re-sent are due
		var seqs []uint64
		s.mu.Lock()
		for _, p := range s.mu.inflight {
			if p.sentMS == now {
				seqs = append(seqs, p.m.seq)
			}
		}
		s.mu.Unlock()
		if len(seqs) != len(tr.frames) {
			t.Fatalf("%d frames written, %d pushes marked re-sent", len(tr.frames), len(seqs))
		}
		return seqs
	}
	if got := resent(100); len(got) != 5 || got[0] != 1 || got[4] != 5 {
		t.Fatalf("first sweep re-sent %v, want seqs 1..5 (half the queue)", got)
	}
	tr.waiting = 3 * len(f.b)
	if got := resent(200); len(got) != 2 || got[0] != 6 || got[1] != 7 {
		t.Fatalf("sweep with a backlog re-sent %v, want seqs 6,7", got)
	}
	tr.waiting = 6 * len(f.b)
	if got := resent(300); len(got) != 0 {
		t.Fatalf("sweep with a backlog over half the queue re-sent %v", got)
	}
	tr.waiting = 0
	if got := resent(400); len(got) != 5 || got[0] != 8 {
		t.Fatalf("next sweep re-sent %v, want seqs 8..12", got)
	}
	s.mu.Lock()
	n := len(s.mu.inflight)
	s.mu.Unlock()
	if n != 20 {
		t.Fatalf("%d pushes tracked, want all 20", n)
	}
}

// TestDispatcherBatchStaysWithinAQuarterOfTheOutboundQueue: when large
// deliveries pile up, no single write gives a connection more than a
// quarter of gateway.outbound_queue_bytes (beyond one frame), so the
// node's own backlog never lands on a reader's slow-consumer bound at
// once; every frame still arrives, in order.
func TestDispatcherBatchStaysWithinAQuarterOfTheOutboundQueue(t *testing.T) {
	g := testGateway(t)
	g.cfg.OutboundQueueBytes = 1 << 20
	_, r := g.testSession("a")
	body := bytes.Repeat([]byte("b"), 16<<10)
	g.pushes = make(chan queued, pushQueueLen)
	const n = 200
	for seq := uint64(1); seq <= n; seq++ { // queued before the dispatcher runs
		g.pushes <- queued{m: &message{frame: newWireFrame(append(body, byte('0'+seq%10))), conv: 1, seq: seq}, users: []string{"a"}}
	}
	g.ctx, g.cancel = contextWithCancel()
	g.sweeper.Add(1)
	go g.dispatch()
	defer func() { g.cancel(); g.sweeper.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.mu.Lock()
		got, calls := 0, len(r.calls)
		for _, c := range r.calls {
			got += len(c)
			size, frame := 0, 0
			for _, p := range c {
				frame = len(p) + wsHeaderLen(len(p))
				size += frame
			}
			// A batch stops at the first frame reaching the quarter.
			if size-frame >= g.cfg.OutboundQueueBytes/4 {
				r.mu.Unlock()
				t.Fatalf("one write of %d frames, %d bytes: over a quarter of the outbound queue", len(c), size)
			}
		}
		r.mu.Unlock()
		if got == n {
			if calls < 2 {
				t.Fatalf("%d frames in %d writes", n, calls)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d frames", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBlockingWriterWritesInlineAndKeepsFramesWhole: over TCP, what the
// socket takes at once is written by the caller and does not count toward
// the bound; once the socket is full the rest queues, the bound drops the
// reader, and a pong sent meanwhile still lands between whole frames.
func TestBlockingWriterWritesInlineAndKeepsFramesWhole(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv := <-accepted
	f := newWireFrame(bytes.Repeat([]byte("p"), 10000))
	w := newBlockingWriter(srv, 20*len(f.b))
	if w.rc == nil {
		t.Fatal("no raw connection under a TCP conn")
	}
	if err := w.write(f); err != nil || w.backlog() != 0 {
		t.Fatalf("first write: %v, backlog %d; want it written inline", err, w.backlog())
	}
	sent, ponged := 1, false
	for ; sent < 100000; sent++ {
		if !ponged && w.backlog() > 0 {
			w.control(newControlFrame(10, []byte("hb")))
			ponged = true
		}
		if err := w.write(f); err != nil {
			if !errors.Is(err, errSlowConsumer) {
				t.Fatal(err)
			}
			break
		}
	}
	if sent == 100000 || !ponged {
		t.Fatalf("the bound never applied (sent %d, ponged %v)", sent, ponged)
	}
	if sent <= 20 {
		t.Fatalf("only %d frames before the bound: the socket's buffer was not used", sent)
	}
	w.close(1000, "bye")
	data, _ := io.ReadAll(cli)
	frames, pongs := 0, 0
	for len(data) > 0 {
		n := wsHeaderLen(0)
		switch data[1] & 0x7F {
		case 126:
			n = 4
		case 127:
			n = 10
		}
		size := n + int(data[1]&0x7F)
		if n == 4 {
			size = n + int(binary.BigEndian.Uint16(data[2:]))
		}
		fin, op, _ := parseFrame(t, data[:size])
		switch {
		case op == 1 && fin:
			frames++
		case op == 10:
			pongs++
		case op == 8:
		default:
			t.Fatalf("frame %d: opcode %d", frames, op)
		}
		data = data[size:]
	}
	if frames != sent || pongs != 1 {
		t.Fatalf("read %d data frames and %d pongs, want %d and 1", frames, pongs, sent)
	}
}
