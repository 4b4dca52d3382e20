package client

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// proxy relays TCP between SDK clients and a real Parley node and reads the
// WebSocket framing as it passes (RFC 6455: 2-byte header, extended length,
// mask key from the client). It records every frame both ways and every
// handshake answer, and a rule can drop a chosen frame or cut the connection
// right after it, so a fault lands at an exact protocol point (a lost ack,
// a lost push, a cut with a request in flight) while the server stays real.
type proxy struct {
	ln     net.Listener
	target string
	hole   atomic.Bool // swallow every server→client byte
	refuse atomic.Bool // close new connections at once: the node looks down
	wg     sync.WaitGroup

	// mu guards the live links, the records and the rule.
	mu struct {
		sync.Mutex
		links      map[*link]bool
		dials      []time.Time
		frames     []seen
		handshakes []handshake
		rule       rule
	}
}

type direction int

const (
	toServer direction = iota
	toClient
)

// seen is one decoded text frame that reached the proxy.
type seen struct {
	dir direction
	at  time.Time
	f   protocol.Frame
}

// handshake is the server's HTTP answer to one upgrade request.
type handshake struct {
	at     time.Time
	status int
	body   []byte // refusals only: the raw body, possibly chunked
}

// verdict is what a rule decides for one frame.
type verdict int

const (
	pass    verdict = iota
	drop            // never reaches the other side
	dropCut         // dropped, then the connection is cut
	passCut         // forwarded, then the connection is cut
)

// rule sees every text frame (decoded) before it is forwarded. It runs on
// the proxy's goroutines, one per direction and connection.
type rule func(dir direction, f *protocol.Frame) verdict

// link is one relayed connection.
type link struct {
	down, up net.Conn
	once     sync.Once
}

func (l *link) cut() {
	l.once.Do(func() {
		l.down.Close()
		l.up.Close()
	})
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: strings.TrimPrefix(target, "ws://")}
	p.mu.links = make(map[*link]bool)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) url() string { return "ws://" + p.ln.Addr().String() }

func (p *proxy) blackhole(on bool) { p.hole.Store(on) }

// down makes the node unreachable through the proxy (new connections are
// closed at once) until up.
func (p *proxy) down(on bool) { p.refuse.Store(on) }

func (p *proxy) setRule(r rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.rule = r
}

// cut drops every live connection without a close frame.
func (p *proxy) cut() {
	p.mu.Lock()
	links := p.mu.links
	p.mu.links = make(map[*link]bool)
	p.mu.Unlock()
	for l := range links {
		l.cut()
	}
}

// sent returns the frames of type typ the clients sent, in order.
func (p *proxy) sent(typ string) []protocol.Frame { return p.framesOf(toServer, typ) }

func (p *proxy) framesOf(dir direction, typ string) []protocol.Frame {
	var out []protocol.Frame
	for _, s := range p.seen(dir, typ) {
		out = append(out, s.f)
	}
	return out
}

func (p *proxy) seen(dir direction, typ string) []seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []seen
	for _, s := range p.mu.frames {
		if s.dir == dir && s.f.Type == typ {
			out = append(out, s)
		}
	}
	return out
}

func (p *proxy) dials() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.mu.dials...)
}

func (p *proxy) handshakes() []handshake {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]handshake(nil), p.mu.handshakes...)
	for i := range out {
		out[i].body = append([]byte(nil), out[i].body...)
	}
	return out
}

// json returns the JSON object of a refusal's body, chunked or not.
func (h handshake) json() []byte {
	i, j := bytes.IndexByte(h.body, '{'), bytes.LastIndexByte(h.body, '}')
	if i < 0 || j < i {
		return nil
	}
	return h.body[i : j+1]
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.mu.dials = append(p.mu.dials, time.Now())
		p.mu.Unlock()
		if p.refuse.Load() {
			down.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			down.Close()
			continue
		}
		l := &link{down: down, up: up}
		p.mu.Lock()
		p.mu.links[l] = true
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); defer l.cut(); p.clientToServer(l) }()
		go func() { defer p.wg.Done(); defer l.cut(); p.serverToClient(l) }()
	}
}

func (p *proxy) clientToServer(l *link) {
	r := bufio.NewReader(l.down)
	if _, err := relayHeader(r, l.up); err != nil {
		return
	}
	p.relayFrames(l, r, l.up, toServer)
}

func (p *proxy) serverToClient(l *link) {
	r := bufio.NewReader(l.up)
	hdr, err := relayHeader(r, p.clientSide(l))
	if err != nil {
		return
	}
	i := p.recordHandshake(handshake{at: time.Now(), status: statusOf(hdr)})
	if statusOf(hdr) == 101 {
		p.relayFrames(l, r, l.down, toClient)
		return
	}
	// A refusal: pass its body on and keep it (raw, maybe chunked) for the test.
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.mu.handshakes[i].body = append(p.mu.handshakes[i].body, buf[:n]...)
			p.mu.Unlock()
			if _, werr := p.clientSide(l).Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) recordHandshake(hs handshake) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.handshakes = append(p.mu.handshakes, hs)
	return len(p.mu.handshakes) - 1
}

// clientSide is where server bytes go: the client, or nowhere while the
// proxy swallows them.
func (p *proxy) clientSide(l *link) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		if p.hole.Load() {
			return len(b), nil
		}
		return l.down.Write(b)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// relayHeader copies the HTTP head (through the blank line) and returns it.
func relayHeader(r *bufio.Reader, w io.Writer) (string, error) {
	var head strings.Builder
	for {
		line, err := r.ReadString('\n')
		head.WriteString(line)
		if err != nil {
			return "", err
		}
		if line == "\r\n" {
			break
		}
	}
	_, err := io.WriteString(w, head.String())
	return head.String(), err
}

func statusOf(head string) int {
	f := strings.Fields(head)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// relayFrames forwards WebSocket frames from r to w. Control frames pass at
// once; the frames of a data message are held until its last fragment so
// the rule decides on the whole message.
func (p *proxy) relayFrames(l *link, r *bufio.Reader, w io.Writer, dir direction) {
	var raw, payload []byte
	for {
		fr, err := readWSFrame(r)
		if err != nil {
			return
		}
		if fr.opcode >= 8 {
			if !p.swallowed(dir) {
				if _, err := w.Write(fr.raw); err != nil {
					return
				}
			}
			continue
		}
		raw = append(raw, fr.raw...)
		payload = append(payload, fr.payload...)
		if !fr.fin {
			continue
		}
		v := p.inspect(dir, payload)
		if (v == pass || v == passCut) && !p.swallowed(dir) {
			if _, err := w.Write(raw); err != nil {
				return
			}
		}
		raw, payload = nil, nil
		if v == dropCut || v == passCut {
			l.cut()
			return
		}
	}
}

func (p *proxy) swallowed(dir direction) bool { return dir == toClient && p.hole.Load() }

func (p *proxy) inspect(dir direction, payload []byte) verdict {
	var f protocol.Frame
	if err := json.Unmarshal(payload, &f); err != nil {
		return pass
	}
	p.mu.Lock()
	p.mu.frames = append(p.mu.frames, seen{dir: dir, at: time.Now(), f: f})
	r := p.mu.rule
	p.mu.Unlock()
	if r == nil {
		return pass
	}
	return r(dir, &f)
}

type wsFrame struct {
	fin     bool
	opcode  byte
	raw     []byte // the frame as it came
	payload []byte // unmasked
}

func readWSFrame(r *bufio.Reader) (wsFrame, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return wsFrame{}, err
	}
	fr := wsFrame{fin: hdr[0]&0x80 != 0, opcode: hdr[0] & 0x0f, raw: append([]byte(nil), hdr[:]...)}
	masked := hdr[1]&0x80 != 0
	n := uint64(hdr[1] & 0x7f)
	switch n {
	case 126:
		var ext [2]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return wsFrame{}, err
		}
		fr.raw = append(fr.raw, ext[:]...)
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err := io.ReadFull(r, ext[:]); err != nil {
			return wsFrame{}, err
		}
		fr.raw = append(fr.raw, ext[:]...)
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > 1<<24 {
		return wsFrame{}, errors.New("proxy: frame too large for a test")
	}
	var key [4]byte
	if masked {
		if _, err := io.ReadFull(r, key[:]); err != nil {
			return wsFrame{}, err
		}
		fr.raw = append(fr.raw, key[:]...)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r, data); err != nil {
		return wsFrame{}, err
	}
	fr.raw = append(fr.raw, data...)
	fr.payload = data
	if masked {
		fr.payload = make([]byte, n)
		for i := range data {
			fr.payload[i] = data[i] ^ key[i%4]
		}
	}
	return fr, nil
}

// onFirst returns a rule that applies v to the first frame matching match and
// passes everything else.
func onFirst(match func(direction, *protocol.Frame) bool, v verdict) rule {
	var done atomic.Bool
	return func(dir direction, f *protocol.Frame) verdict {
		if match(dir, f) && done.CompareAndSwap(false, true) {
			return v
		}
		return pass
	}
}

// frameIs matches frames of type typ going in dir.
func frameIs(dir direction, typ string) func(direction, *protocol.Frame) bool {
	return func(d direction, f *protocol.Frame) bool { return d == dir && f.Type == typ }
}
