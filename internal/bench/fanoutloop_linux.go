//go:build linux

package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// The fan-out client holds its connections on one epoll loop, a thread of
// its own: after the handshake (done with the standard library) each
// socket's descriptor is taken out of Go's poller and read with read(2)
// when epoll reports it, into one buffer shared by all connections. Frames
// are parsed in place (server frames are never fragmented or masked,
// docs/protocol.md) and a push is read only for type, conv_id, seq, kind,
// server_time and the body's stamp (parsePush). Acks and pings are built
// into a per-connection buffer and written with one write(2) per
// connection per wake-up. A goroutine per connection with gorilla and
// encoding/json cost more CPU per delivery than the server it measured.

// loopConn is one member's connection; only the loop goroutine touches it
// once it is published.
type loopConn struct {
	fd    int
	idx   int // in loopClient.conns, the epoll event's data
	user  string
	seqs  connSeqs
	in    []byte // a frame received in part
	out   []byte // frames not yet written (the socket was full)
	dead  bool
	wantW bool // EPOLLOUT registered

	lastWrite int64 // unix ns
	// pending is the highest contiguous (conv, seq) not yet acknowledged,
	// for cumulative acks.
	pendConv, pendSeq   uint64
	ackedConv, ackedSeq uint64
}

type loopClient struct {
	cfg  FanoutClientConfig
	key  []byte
	mask [4]byte
	rec  *fanoutRec

	epfd      int
	heartbeat atomic.Int64 // the node's ping interval, ns
	live      atomic.Int64
	stopping  atomic.Bool
	loopDone  chan struct{}

	conns []atomic.Pointer[loopConn] // by index From..To-1
}

// runFanoutConns opens the connections, reports ready, serves report
// commands until in ends, then closes every connection.
func runFanoutConns(ctx context.Context, cfg FanoutClientConfig, key []byte, ready func(n int), serve func(report func() FanoutReport)) error {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	lc := &loopClient{cfg: cfg, key: key, rec: newFanoutRec(), epfd: epfd, loopDone: make(chan struct{}),
		conns: make([]atomic.Pointer[loopConn], cfg.To-cfg.From)}
	if _, err := rand.Read(lc.mask[:]); err != nil {
		return err
	}
	go lc.loop()
	defer lc.closeAll()
	if err := lc.open(ctx); err != nil {
		return err
	}
	ready(int(lc.live.Load()))
	serve(lc.report)
	return nil
}

func (lc *loopClient) report() FanoutReport {
	r := lc.rec.report()
	n := 0
	for i := range lc.conns {
		if lc.conns[i].Load() != nil {
			n++
		}
	}
	r.Opened, r.Live = n, int(lc.live.Load())
	return r
}

// open connects every user, Concurrency at a time, and stops at the first
// failure: a member silently missing would read as a lost delivery.
func (lc *loopClient) open(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	n := len(lc.conns)
	for range min(lc.cfg.Concurrency, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				user := lc.cfg.Prefix + strconv.Itoa(lc.cfg.From+int(i))
				if err := lc.openOne(ctx, int(i), user); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func (lc *loopClient) openOne(ctx context.Context, idx int, user string) error {
	fd, rest, hb, err := lc.dial(ctx, user)
	if err != nil {
		return err
	}
	lc.heartbeat.Store(int64(hb))
	c := &loopConn{fd: fd, idx: idx, user: user, lastWrite: time.Now().UnixNano()}
	if len(rest) > 0 {
		c.in = append([]byte(nil), rest...)
	}
	lc.conns[idx].Store(c)
	lc.live.Add(1)
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(idx)}
	if err := syscall.EpollCtl(lc.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	return nil
}

// dial performs the WebSocket handshake for user with the standard
// library, reads the hello, and returns a duplicate of the socket's
// descriptor (the net.Conn is closed) with whatever was read past the
// hello. A 503 is retried after its Retry-After, as dialer.dial does.
func (lc *loopClient) dial(ctx context.Context, user string) (int, []byte, time.Duration, error) {
	now := time.Now()
	tok, err := auth.MintHS256(lc.key, auth.Claims{User: user, IssuedAt: now, Expires: now.Add(24 * time.Hour)})
	if err != nil {
		return -1, nil, 0, err
	}
	nd := &net.Dialer{Timeout: 10 * time.Second}
	if ip := net.ParseIP(lc.cfg.LocalIP); ip != nil {
		nd.LocalAddr = &net.TCPAddr{IP: ip}
	}
	for attempt := 1; ; attempt++ {
		fd, rest, hb, retry, err := lc.handshake(ctx, nd, user, tok)
		if err == nil {
			return fd, rest, hb, nil
		}
		if retry == 0 || attempt == maxDialAttempts {
			return -1, nil, 0, fmt.Errorf("dial %s: %w", user, err)
		}
		select {
		case <-ctx.Done():
			return -1, nil, 0, fmt.Errorf("dial %s: %w", user, ctx.Err())
		case <-time.After(min(retry, 3*time.Second) + mrand.N(500*time.Millisecond)):
		}
	}
}

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func (lc *loopClient) handshake(ctx context.Context, nd *net.Dialer, user, tok string) (fd int, rest []byte, hb, retry time.Duration, err error) {
	conn, err := nd.DialContext(ctx, "tcp", lc.cfg.Addr)
	if err != nil {
		return -1, nil, 0, 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	var k [16]byte
	_, _ = rand.Read(k[:])
	key := base64.StdEncoding.EncodeToString(k[:])
	req := "GET /v1/ws?device=" + lc.cfg.Device + " HTTP/1.1\r\nHost: " + lc.cfg.Addr +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key +
		"\r\nAuthorization: Bearer " + tok + "\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		return -1, nil, 0, 0, err
	}
	br := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return -1, nil, 0, 0, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		if resp.StatusCode == http.StatusServiceUnavailable {
			retry = time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
				retry = time.Duration(s) * time.Second
			}
		}
		return -1, nil, 0, retry, fmt.Errorf("handshake: HTTP %s", resp.Status)
	}
	sum := sha1.Sum([]byte(key + wsGUID))
	if resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		return -1, nil, 0, 0, errors.New("handshake: bad Sec-WebSocket-Accept")
	}
	// The hello is the first frame.
	var buf []byte
	for {
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			buf = append(buf, b...)
			_, _ = br.Discard(n)
		}
		op, payload, used, ok, ferr := nextFrame(buf)
		if ferr != nil {
			return -1, nil, 0, 0, ferr
		}
		if ok {
			var f protocol.Frame
			if op != opText || json.Unmarshal(payload, &f) != nil || f.Type != protocol.TypeHello || f.Hello == nil {
				return -1, nil, 0, 0, errNoHello
			}
			hb = time.Duration(f.Hello.HeartbeatMS) * time.Millisecond
			rest = buf[used:]
			break
		}
		if _, err := br.Peek(1); err != nil {
			return -1, nil, 0, 0, fmt.Errorf("read hello: %w", err)
		}
	}
	rc, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1, nil, 0, 0, err
	}
	var derr error
	if cerr := rc.Control(func(s uintptr) { fd, derr = syscall.Dup(int(s)) }); cerr != nil {
		return -1, nil, 0, 0, cerr
	}
	if derr != nil {
		return -1, nil, 0, 0, derr
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return -1, nil, 0, 0, err
	}
	return fd, rest, hb, 0, nil
}

const (
	opCont  = 0
	opText  = 1
	opClose = 8
	opPing  = 9
	opPong  = 10
	// maxServerFrame bounds a frame the client buffers: the node's frames
	// are limited to max_frame_bytes (64 KiB by default).
	maxServerFrame = 1 << 20
)

var errServerFrame = errors.New("frame the node must not send (masked, fragmented, binary or oversized)")

// nextFrame parses one unmasked, unfragmented server frame at the start of
// b: its opcode, payload and length, or ok=false when b holds only part
// of it.
func nextFrame(b []byte) (op byte, payload []byte, used int, ok bool, err error) {
	if len(b) < 2 {
		return 0, nil, 0, false, nil
	}
	op = b[0] & 0x0f
	if b[0]&0x80 == 0 || b[0]&0x70 != 0 || b[1]&0x80 != 0 || (op != opText && op != opClose && op != opPing && op != opPong) {
		return 0, nil, 0, false, errServerFrame
	}
	n, h := uint64(b[1]&0x7f), 2
	switch n {
	case 126:
		if len(b) < 4 {
			return 0, nil, 0, false, nil
		}
		n, h = uint64(binary.BigEndian.Uint16(b[2:])), 4
	case 127:
		if len(b) < 10 {
			return 0, nil, 0, false, nil
		}
		n, h = binary.BigEndian.Uint64(b[2:]), 10
	}
	if n > maxServerFrame {
		return 0, nil, 0, false, errServerFrame
	}
	if uint64(len(b)-h) < n {
		return 0, nil, 0, false, nil
	}
	end := h + int(n)
	return op, b[h:end], end, true, nil
}

// appendClientFrame appends a masked client frame (payload < 126 bytes or
// up to 64 KiB) to out.
func (lc *loopClient) appendClientFrame(out []byte, op byte, payload []byte) []byte {
	out = append(out, 0x80|op)
	if len(payload) < 126 {
		out = append(out, 0x80|byte(len(payload)))
	} else {
		out = append(out, 0x80|126, byte(len(payload)>>8), byte(len(payload)))
	}
	out = append(out, lc.mask[:]...)
	start := len(out)
	out = append(out, payload...)
	for i := range payload {
		out[start+i] ^= lc.mask[i&3]
	}
	return out
}

func (lc *loopClient) appendDelivered(out []byte, conv, seq uint64) []byte {
	var p [96]byte
	b := append(p[:0], `{"type":"delivered","conv_id":"`...)
	b = strconv.AppendUint(b, conv, 10)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, '}')
	return lc.appendClientFrame(out, opText, b)
}

var pingPayload = []byte(`{"type":"ping"}`)

// loop is the event loop: one OS thread reads every connection.
func (lc *loopClient) loop() {
	runtime.LockOSThread()
	defer close(lc.loopDone)
	events := make([]syscall.EpollEvent, 256)
	buf := make([]byte, 256<<10)
	slots := 1
	if lc.cfg.AckEvery > 0 {
		slots = max(1, int(lc.cfg.AckEvery/maintTick))
	} else {
		slots = max(1, int(time.Second/maintTick))
	}
	nextTick, tick := time.Now().Add(maintTick), 0
	var touched []*loopConn
	for !lc.stopping.Load() {
		wait := max(0, int(time.Until(nextTick)/time.Millisecond)+1)
		n, err := syscall.EpollWait(lc.epfd, events, wait)
		if err != nil && !errors.Is(err, syscall.EINTR) {
			lc.cfg.Logger.Error("epoll wait", "err", err)
			return
		}
		now := time.Now()
		batch := lc.rec.begin(now)
		for _, ev := range events[:max(n, 0)] {
			c := lc.conns[ev.Fd].Load()
			if c == nil || c.dead {
				continue
			}
			if ev.Events&syscall.EPOLLOUT != 0 {
				lc.flush(c)
			}
			if ev.Events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				if lc.read(c, buf, &batch) {
					touched = append(touched, c)
				}
			}
		}
		lc.rec.end(&batch)
		// Acks of this wake-up, one write per connection.
		for _, c := range touched {
			if !c.dead && len(c.out) > 0 {
				lc.flush(c)
			}
		}
		clear(touched)
		touched = touched[:0]
		if !now.Before(nextTick) {
			lc.maintain(tick%slots, slots, now)
			tick++
			nextTick = nextTick.Add(maintTick)
			if now.After(nextTick) {
				nextTick = now.Add(maintTick)
			}
		}
	}
}

// read reads what the socket holds and handles its frames; it reports
// whether acks were queued.
func (lc *loopClient) read(c *loopConn, buf []byte, batch *recBatch) bool {
	n := copy(buf, c.in)
	if n < len(c.in) {
		lc.fail(c, errServerFrame)
		return false
	}
	m, err := syscall.Read(c.fd, buf[n:])
	switch {
	case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR):
		return false
	case err != nil:
		lc.fail(c, err)
		return false
	case m == 0:
		lc.fail(c, errors.New("closed by the server"))
		return false
	}
	data := buf[:n+m]
	acked := false
	for {
		op, payload, used, ok, err := nextFrame(data)
		if err != nil {
			lc.fail(c, err)
			return false
		}
		if !ok {
			break
		}
		data = data[used:]
		switch op {
		case opClose:
			lc.fail(c, errors.New("close frame from the server"))
			return false
		case opPing:
			c.out = lc.appendClientFrame(c.out, opPong, payload)
			acked = true
		case opText:
			p, isMsg, ok := parsePush(payload)
			if !ok {
				lc.fail(c, fmt.Errorf("unreadable frame %.200q", payload))
				return false
			}
			if !isMsg {
				continue
			}
			advanced := batch.push(&c.seqs, p)
			switch {
			case !advanced:
			case lc.cfg.AckByPush && p.Ack == protocol.AckNone:
				// Untracked (a large group's): never acknowledged.
			case lc.cfg.AckEvery == 0 || lc.cfg.AckByPush && p.Ack == "":
				// A delivered per push, as a client that acks each
				// message it shows; the frames of one read go out in
				// one write.
				c.out = lc.appendDelivered(c.out, p.Conv, c.seqs.contig)
				acked = true
			default:
				c.pendConv, c.pendSeq = p.Conv, c.seqs.contig
			}
		}
	}
	c.in = append(c.in[:0], data...)
	return acked
}

// maintain serves one slot of the connections: its pending cumulative
// acks, and a ping where nothing was written for half a heartbeat.
func (lc *loopClient) maintain(slot, slots int, now time.Time) {
	hb := time.Duration(lc.heartbeat.Load())
	ns := now.UnixNano()
	for i := slot; i < len(lc.conns); i += slots {
		c := lc.conns[i].Load()
		if c == nil || c.dead {
			continue
		}
		if lc.cfg.AckEvery > 0 && c.pendSeq != 0 && (c.pendConv != c.ackedConv || c.pendSeq > c.ackedSeq) {
			c.ackedConv, c.ackedSeq = c.pendConv, c.pendSeq
			c.out = lc.appendDelivered(c.out, c.pendConv, c.pendSeq)
		} else if hb > 0 && ns-c.lastWrite >= int64(hb/2) {
			c.out = lc.appendClientFrame(c.out, opText, pingPayload)
		}
		if len(c.out) > 0 {
			lc.flush(c)
		}
	}
}

// flush writes c.out; what the socket does not take waits for EPOLLOUT.
func (lc *loopClient) flush(c *loopConn) {
	for len(c.out) > 0 {
		n, err := syscall.Write(c.fd, c.out)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.EAGAIN) {
			break
		}
		if err != nil {
			lc.fail(c, err)
			return
		}
		c.out = c.out[:copy(c.out, c.out[n:])]
		c.lastWrite = time.Now().UnixNano()
	}
	want := len(c.out) > 0
	if want != c.wantW {
		c.wantW = want
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.idx)}
		if want {
			ev.Events |= syscall.EPOLLOUT
		}
		_ = syscall.EpollCtl(lc.epfd, syscall.EPOLL_CTL_MOD, c.fd, &ev)
	}
}

func (lc *loopClient) fail(c *loopConn, err error) {
	if c.dead {
		return
	}
	c.dead = true
	lc.live.Add(-1)
	_ = syscall.EpollCtl(lc.epfd, syscall.EPOLL_CTL_DEL, c.fd, nil)
	if !lc.stopping.Load() {
		lc.cfg.Logger.Warn("connection closed", "user", c.user, "err", err)
	}
}

// closeAll stops the loop and closes every connection.
func (lc *loopClient) closeAll() {
	lc.stopping.Store(true)
	<-lc.loopDone
	for i := range lc.conns {
		if c := lc.conns[i].Load(); c != nil {
			syscall.Close(c.fd)
		}
	}
	syscall.Close(lc.epfd)
}
