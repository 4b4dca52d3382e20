package crashtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/testbin"
	"github.com/parley-im/parley/protocol"
)

var binary string

func TestMain(m *testing.M) { testbin.Main(m, &binary) }

// node is one run of the server process on a fixed address and data dir.
type node struct {
	t       *testing.T
	addr    string
	dataDir string
	keyHex  string
	args    []string // more arguments of serve
	env     []string // more environment of serve
	cmd     *exec.Cmd
}

func (n *node) start() {
	n.t.Helper()
	args := append([]string{"serve", "--listen", n.addr, "--data-dir", n.dataDir,
		"--auth.hs256-key", n.keyHex, "--log.level", "warn"}, n.args...)
	n.cmd = exec.Command(binary, args...)
	n.cmd.Stderr = os.Stderr
	if n.env != nil {
		n.cmd.Env = append(os.Environ(), n.env...)
	}
	if err := n.cmd.Start(); err != nil {
		n.t.Fatalf("start parley: %v", err)
	}
	if !testbin.Ready(n.addr, 30*time.Second) {
		n.t.Fatal("parley did not become ready within 30s")
	}
}

func (n *node) kill9() {
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Wait()
}

func (n *node) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		n.kill9()
	}
}

func (n *node) token(user string) string {
	key, _ := hex.DecodeString(n.keyHex)
	tok, err := auth.MintHS256(key, auth.Claims{User: user, IssuedAt: time.Now().Add(-time.Minute), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		n.t.Fatal(err)
	}
	return tok
}

// conn is a synchronous request/response client that ignores pushes.
type conn struct {
	ws  *websocket.Conn
	rid int
}

func (n *node) dial(user string) (*conn, error) {
	h := http.Header{"Authorization": {"Bearer " + n.token(user)}}
	d := websocket.Dialer{HandshakeTimeout: 2 * time.Second}
	ws, _, err := d.Dial("ws://"+n.addr+"/v1/ws?device=storm", h)
	if err != nil {
		return nil, err
	}
	return &conn{ws: ws}, nil
}

func (c *conn) call(f protocol.Frame) (*protocol.Frame, error) {
	c.rid++
	f.RID = fmt.Sprint(c.rid)
	_ = c.ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.ws.WriteJSON(f); err != nil {
		return nil, err
	}
	_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			return nil, err
		}
		var r protocol.Frame
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, err
		}
		if r.RID == f.RID {
			return &r, nil
		}
	}
}

// acked is what the clients were told: conv → seq → client_msg_id.
type acked struct {
	mu   sync.Mutex
	seqs map[uint64]map[uint64]string
	err  error
}

func (a *acked) record(conv, seq uint64, cmid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.seqs[conv]
	if m == nil {
		m = make(map[uint64]string)
		a.seqs[conv] = m
	}
	if prev, ok := m[seq]; ok && prev != cmid && a.err == nil {
		a.err = fmt.Errorf("conv %d seq %d acknowledged for %q and for %q: seq reused", conv, seq, prev, cmid)
	}
	m[seq] = cmid
}

// sender sends until stop closes, retrying an unacknowledged message with
// the same client_msg_id across errors, reconnects and server crashes.
func sender(ctx context.Context, n *node, user string, convs []uint64, got *acked, stop <-chan struct{}) {
	var (
		c       *conn
		pending *protocol.Frame
		i       int
	)
	for {
		if pending == nil {
			select {
			case <-stop:
				if c != nil {
					c.ws.Close()
				}
				return
			default:
			}
			i++
			conv := convs[i%len(convs)]
			pending = &protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: fmt.Sprintf("%s-%d", user, i), Body: fmt.Sprintf("%s says %d", user, i)}
		}
		if ctx.Err() != nil {
			return
		}
		if c == nil {
			var err error
			if c, err = n.dial(user); err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
		}
		r, err := c.call(*pending)
		if err != nil {
			c.ws.Close()
			c = nil
			continue
		}
		switch {
		case r.Type == protocol.TypeAck:
			got.record(r.ConvID, r.Seq, pending.ClientMsgID)
			pending = nil
		case r.Code.Retryable():
			time.Sleep(10 * time.Millisecond)
		default:
			got.mu.Lock()
			got.err = fmt.Errorf("send %s: %s %s", pending.ClientMsgID, r.Code, r.Error)
			got.mu.Unlock()
			pending = nil
		}
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestKill9DuringSendStorm kills the server with SIGKILL several times while
// many clients send, restarts it on the same data, and checks that every
// acknowledged message is stored exactly once, seqs are dense and no seq
// was ever given to two messages.
func TestKill9DuringSendStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("crash cycles take ~20s")
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	n := &node{t: t, addr: freeAddr(t), dataDir: t.TempDir(), keyHex: hex.EncodeToString(key)}
	n.start()

	const users = 8
	names := make([]string, users)
	for i := range names {
		names[i] = fmt.Sprintf("u%d", i)
	}
	admin, err := n.dial("u0")
	if err != nil {
		t.Fatal(err)
	}
	group, err := admin.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "storm", Members: names[1:]})
	if err != nil || group.Type != protocol.TypeConv {
		t.Fatalf("create group: %v %+v", err, group)
	}
	convsOf := make([][]uint64, users)
	for i := 0; i < users; i += 2 {
		c, err := n.dial(names[i])
		if err != nil {
			t.Fatal(err)
		}
		d, err := c.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: names[i+1]})
		if err != nil || d.Type != protocol.TypeConv {
			t.Fatalf("open direct: %v %+v", err, d)
		}
		c.ws.Close()
		convsOf[i] = []uint64{group.Conv.ConvID, d.Conv.ConvID}
		convsOf[i+1] = convsOf[i]
	}
	admin.ws.Close()

	got := &acked{seqs: make(map[uint64]map[uint64]string)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, u := range names {
		wg.Add(1)
		go func() { defer wg.Done(); sender(ctx, n, u, convsOf[i], got, stop) }()
	}
	const cycles = 4
	for cycle := 0; cycle < cycles; cycle++ {
		time.Sleep(1500 * time.Millisecond)
		n.kill9()
		time.Sleep(100 * time.Millisecond)
		n.start()
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	if got.err != nil {
		t.Fatal(got.err)
	}

	verify(t, n, got)
	n.stop()
}

func verify(t *testing.T, n *node, got *acked) {
	t.Helper()
	total := 0
	c, err := n.dial("u0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.ws.Close()
	for conv, seqs := range got.seqs {
		// u0 is in the group and in the direct conversation with u1; other
		// direct conversations are read by their first member.
		reader := c
		if _, ok := seqs[0]; ok {
			t.Fatalf("conv %d: seq 0 acknowledged", conv)
		}
		stored := history(t, reader, conv)
		if stored == nil {
			for _, u := range []string{"u2", "u4", "u6"} {
				rc, err := n.dial(u)
				if err != nil {
					t.Fatal(err)
				}
				stored = history(t, rc, conv)
				rc.ws.Close()
				if stored != nil {
					break
				}
			}
		}
		byCmid := make(map[string]uint64, len(stored))
		for i, m := range stored {
			if m.Seq != uint64(i+1) {
				t.Fatalf("conv %d: message %d has seq %d: seqs not dense", conv, i, m.Seq)
			}
			if prev, dup := byCmid[m.ClientMsgID]; dup {
				t.Fatalf("conv %d: client_msg_id %q stored twice (seq %d and %d)", conv, m.ClientMsgID, prev, m.Seq)
			}
			byCmid[m.ClientMsgID] = m.Seq
		}
		for seq, cmid := range seqs {
			if s, ok := byCmid[cmid]; !ok || s != seq {
				t.Fatalf("conv %d: acknowledged %q at seq %d, stored at %d (present %v)", conv, cmid, seq, s, ok)
			}
			total++
		}
	}
	t.Logf("%d acknowledged messages verified across %d conversations", total, len(got.seqs))
	if total == 0 {
		t.Fatal("no message was acknowledged")
	}
}

// history reads a whole conversation, or returns nil if c is not a member.
func history(t *testing.T, c *conn, conv uint64) []protocol.Message {
	t.Helper()
	var out []protocol.Message
	after := uint64(0)
	for {
		r, err := c.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, AfterSeq: &after, Limit: 200})
		if err != nil {
			t.Fatal(err)
		}
		if r.Type == protocol.TypeError {
			if r.Code == protocol.CodeNotMember {
				return nil
			}
			t.Fatalf("history: %s %s", r.Code, r.Error)
		}
		out = append(out, r.Messages...)
		if !r.HasMore {
			return out
		}
		after = out[len(out)-1].Seq
	}
}
