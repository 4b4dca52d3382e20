package gateway

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Per-source accept pacing: the cheapest place to refuse a handshake flood
// is before the connection reaches the event loop — no registration, no
// read, no HTTP parse, no token check, no answer. A listener wrapper takes
// each TCP connection from the kernel and hands it on at once while its
// source address is within gateway.source_accept_rate (burst
// gateway.source_accept_burst); over it, the connection waits, not yet
// registered or read, until the source's budget allows it (paced, in
// order), so a flooding client gets no faster than the rate however hard
// it tries, and everything else the node does — established connections'
// frames first — keeps the CPU. A source with a burst's worth of
// connections already waiting, or a node holding max_pending_connections
// of them, has further connections reset at once (RST, no answer: nothing
// is parsed). Sources are told apart by IP address only (IPv6 by /64 would
// be the next step); behind a proxy that does not pass client addresses
// every connection comes from the proxy, so there the limit must be 0
// (off) or sized for all clients together (docs/deploy.md).

// sourceBudget is one source address's token bucket. tokens below zero
// count the connections of the source waiting for their turn.
type sourceBudget struct {
	tokens float64
	last   time.Time
}

// pacer decides, per source, when an accepted connection may go on.
type pacer struct {
	rate, burst float64
	maxHeld     int // connections waiting, all sources together

	mu      sync.Mutex
	sources map[netip.Addr]*sourceBudget // guarded by mu
	held    int                          // guarded by mu
}

// maxSources bounds the budgets kept; past it the full ones are dropped,
// and if none is full a new source is not paced (a wide flood is the
// admission bucket's and max_connections' to bound).
const maxSources = 1 << 16

// reserve returns how long a connection from src must wait (0: go on now),
// or ok false if it must be refused.
func (p *pacer) reserve(src netip.Addr, now time.Time) (wait time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.sources[src]
	if b == nil {
		if len(p.sources) >= maxSources {
			p.prune(now)
			if len(p.sources) >= maxSources {
				return 0, true
			}
		}
		b = &sourceBudget{tokens: p.burst, last: now}
		p.sources[src] = b
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(p.burst, b.tokens+el*p.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	// Waiting: at most a burst's worth per source, maxHeld in all.
	if b.tokens-1 < -p.burst || p.held >= p.maxHeld {
		return 0, false
	}
	b.tokens--
	p.held++
	return time.Duration(-b.tokens / p.rate * float64(time.Second)), true
}

// released records that a waiting connection went on (or was closed).
func (p *pacer) released() {
	p.mu.Lock()
	p.held--
	p.mu.Unlock()
}

// prune drops the budgets that have refilled: such a source is the same
// as an unknown one. It runs under mu.
func (p *pacer) prune(now time.Time) {
	for a, b := range p.sources {
		if b.tokens+now.Sub(b.last).Seconds()*p.rate >= p.burst {
			delete(p.sources, a)
		}
	}
}

// pacedListener is a net.Listener that hands connections on at their
// source's pace (see pacer).
type pacedListener struct {
	net.Listener
	p   *pacer
	log *slog.Logger
	out chan net.Conn // connections that may go on

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	errMu     sync.Mutex
	err       error // the underlying Accept's final error

	logMu   sync.Mutex
	lastLog time.Time // last "source paced" line

	heldMu sync.Mutex
	held   map[net.Conn]*time.Timer // connections waiting their turn; nil once closed
}

// PaceSources wraps ln with per-source accept pacing when cfg sets a rate
// (SourceAcceptRate > 0); otherwise it returns ln.
func PaceSources(ln net.Listener, cfg Config, log *slog.Logger) net.Listener {
	if cfg.SourceAcceptRate <= 0 {
		return ln
	}
	l := &pacedListener{
		Listener: ln,
		p: &pacer{rate: cfg.SourceAcceptRate, burst: float64(cfg.SourceAcceptBurst), maxHeld: cfg.MaxPendingConnections,
			sources: make(map[netip.Addr]*sourceBudget)},
		log:  log,
		out:  make(chan net.Conn),
		done: make(chan struct{}),
		held: make(map[net.Conn]*time.Timer),
	}
	go l.run()
	return l
}

// Accept returns the next connection whose turn has come.
func (l *pacedListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.out:
		return c, nil
	case <-l.done:
		l.errMu.Lock()
		defer l.errMu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

// Close closes the listener and resets the connections still waiting.
func (l *pacedListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	l.heldMu.Lock()
	held := l.held
	l.held = nil
	l.heldMu.Unlock()
	for c, t := range held {
		if t.Stop() {
			reset(c)
			l.p.released()
		}
	}
	return err
}

// hold passes c on after wait, unless the listener closes first.
func (l *pacedListener) hold(c net.Conn, wait time.Duration) {
	l.heldMu.Lock()
	defer l.heldMu.Unlock()
	if l.held == nil {
		reset(c)
		l.p.released()
		return
	}
	l.held[c] = time.AfterFunc(wait, func() {
		l.heldMu.Lock()
		if l.held != nil {
			delete(l.held, c)
		}
		l.heldMu.Unlock()
		defer l.p.released()
		l.pass(c)
	})
}

// run takes connections from the kernel and passes them on, now or at
// their turn.
func (l *pacedListener) run() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond) // e.g. out of descriptors: retry
				continue
			}
			l.errMu.Lock()
			l.err = err
			l.errMu.Unlock()
			l.closeOnce.Do(func() { close(l.done) })
			return
		}
		src := sourceOf(c)
		wait, ok := l.p.reserve(src, time.Now())
		switch {
		case !ok:
			l.note(src)
			reset(c)
		case wait == 0:
			l.pass(c)
		default:
			l.note(src)
			l.hold(c, wait)
		}
	}
}

// pass hands c to Accept, or closes it if the listener is closed first.
func (l *pacedListener) pass(c net.Conn) {
	select {
	case l.out <- c:
	case <-l.done:
		reset(c)
	}
}

// note logs, at most once a minute, that a source is being paced: behind a
// proxy that hides client addresses this is the sign that the limit must
// be lifted.
func (l *pacedListener) note(src netip.Addr) {
	now := time.Now()
	l.logMu.Lock()
	defer l.logMu.Unlock()
	if now.Sub(l.lastLog) < time.Minute {
		return
	}
	l.lastLog = now
	l.log.Warn("gateway: connections from one address over gateway.source_accept_rate are paced (if this node is behind a proxy that hides client addresses, set it to 0)",
		"source", src.String(), "rate", l.p.rate, "burst", l.p.burst)
}

// sourceOf is c's remote IP address (the zero Addr if it has none).
func sourceOf(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// reset closes c with a RST: no FIN handshake, no TIME_WAIT on the node.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
