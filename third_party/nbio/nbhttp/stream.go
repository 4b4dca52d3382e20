// Copyright 2020 lesismal. All rights reserved.
// Use of this source code is governed by an MIT-style
// license that can be found in the LICENSE file.

package nbhttp

import (
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Streamed request bodies. [parley patch H7]
//
// A request whose route Config.StreamBody accepts is handed to its handler
// as soon as its head is in, with a Body that streams what arrives: the
// poller appends the bytes it reads, the handler's goroutine reads them.
// Past streamHighWater buffered bytes the connection's reads are paused
// (nbio.Conn.PauseRead), so a handler slower than the client holds the
// client back by TCP flow control instead of buffering; they resume below
// streamLowWater. Such a request needs a Content-Length (a chunked one is
// buffered as usual, within MaxHTTPBodySize), and its connection closes
// after the response. A handler that answers before reading the whole body
// makes the connection linger as a refused request's does (patch H3): a
// FIN after the answer, then what the client still sends is discarded
// until the body's end or lingerTime.

const (
	streamHighWater = 128 << 10
	streamLowWater  = 64 << 10
	// streamChunk is the size of the pooled buffers a read's bytes are
	// copied into (the event loop's read buffer is reused at once).
	streamChunk = 64 << 10
)

var streamChunks = sync.Pool{New: func() any { b := make([]byte, 0, streamChunk); return &b }}

// chunkOf returns a copy of data, in a pooled buffer when it fits one.
//
//go:norace
func chunkOf(data []byte) []byte {
	if len(data) > streamChunk {
		return append([]byte(nil), data...)
	}
	bp := streamChunks.Get().(*[]byte)
	return append((*bp)[:0], data...)
}

// freeChunk gives a buffer of chunkOf's back to the pool.
//
//go:norace
func freeChunk(b []byte) {
	if cap(b) == streamChunk {
		b = b[:0]
		streamChunks.Put(&b)
	}
}

type pauser interface {
	PauseRead() bool
	ResumeRead()
}

// underlying is the connection under nbhttp's wrapper, whose methods
// (PauseRead, WaitQueued, CloseWriteIfFlushed) the wrapper does not have.
//
//go:norace
func underlying(c net.Conn) net.Conn {
	if hc, ok := c.(*Conn); ok && hc.Conn != nil {
		return hc.Conn
	}
	return c
}

type streamBody struct {
	conn net.Conn
	idle time.Duration // longest wait for bytes while none are buffered (0: none)

	mu     sync.Mutex
	bufs   [][]byte
	head   int // read offset in bufs[0]
	queued int
	remain int64 // body bytes still to arrive
	err    error // the connection ended before the body did, or idle passed
	closed bool  // the handler is done: what arrives is discarded
	paused bool
	wake   chan struct{} // closed when bytes or an error arrive
}

//go:norace
func (b *streamBody) UnderlayerConn() net.Conn { return b.conn }

// Parse takes body bytes read by the poller. Bytes past the body's end
// (a pipelined request) are dropped: the connection closes after this
// request.
//
//go:norace
func (b *streamBody) Parse(data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if int64(len(data)) > b.remain {
		data = data[:b.remain]
	}
	b.remain -= int64(len(data))
	if b.closed {
		if b.remain == 0 {
			// The rest of a refused body arrived; closed after b.mu is
			// released, as the close runs CloseAndClean.
			defer func() { _ = b.conn.Close() }()
		}
		return nil
	}
	if len(data) > 0 {
		b.bufs = append(b.bufs, chunkOf(data))
		b.queued += len(data)
	}
	if !b.paused && b.queued >= streamHighWater {
		if p, ok := b.conn.(pauser); ok && p.PauseRead() {
			b.paused = true
		}
	}
	b.signal()
	return nil
}

//go:norace
func (b *streamBody) signal() {
	if b.wake != nil {
		close(b.wake)
		b.wake = nil
	}
}

// CloseAndClean runs when the connection closes.
//
//go:norace
func (b *streamBody) CloseAndClean(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.remain > 0 && b.err == nil {
		b.err = io.ErrUnexpectedEOF
	}
	b.signal()
}

// Read is the handler's side.
//
//go:norace
func (b *streamBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.bufs) == 0 {
		switch {
		case b.closed:
			return 0, http.ErrBodyReadAfterClose
		case b.remain == 0:
			return 0, io.EOF
		case b.err != nil:
			return 0, b.err
		}
		if b.wake == nil {
			b.wake = make(chan struct{})
		}
		wake := b.wake
		b.mu.Unlock()
		var (
			t       *time.Timer
			timeout <-chan time.Time
		)
		if b.idle > 0 {
			t = time.NewTimer(b.idle)
			timeout = t.C
		}
		select {
		case <-wake:
			b.mu.Lock()
		case <-timeout:
			b.mu.Lock()
			if len(b.bufs) == 0 && b.err == nil && b.remain > 0 && !b.closed {
				b.err = ErrRequestTimeout
			}
		}
		if t != nil {
			t.Stop()
		}
	}
	// As much as p holds of what is buffered, across the poller's reads,
	// so that a reader with a large buffer makes few large writes.
	n := 0
	for n < len(p) && len(b.bufs) > 0 {
		c := copy(p[n:], b.bufs[0][b.head:])
		n += c
		b.head += c
		if b.head == len(b.bufs[0]) {
			freeChunk(b.bufs[0])
			b.bufs[0] = nil
			b.bufs = b.bufs[1:]
			b.head = 0
		}
	}
	b.queued -= n
	if b.paused && b.queued <= streamLowWater {
		b.paused = false
		b.conn.(pauser).ResumeRead()
	}
	return n, nil
}

// Close is the handler's end of the body: what is buffered is dropped and
// what still arrives is discarded.
//
//go:norace
func (b *streamBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closeLocked()
	return nil
}

//go:norace
func (b *streamBody) closeLocked() {
	if b.closed {
		return
	}
	b.closed = true
	for _, c := range b.bufs {
		freeChunk(c)
	}
	b.bufs, b.head, b.queued = nil, 0, 0
	if b.paused {
		b.paused = false
		b.conn.(pauser).ResumeRead()
	}
	b.signal()
}

// linger ends a request answered before its whole body arrived: it
// reports false when the body is all in (the connection can close), else
// discards the rest, sends a FIN after the answer and bounds the wait for
// the rest with lingerTime.
//
//go:norace
func (b *streamBody) linger() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.remain == 0 || b.err != nil {
		return false
	}
	b.closeLocked()
	if cw, ok := b.conn.(interface{ CloseWriteIfFlushed() bool }); ok {
		cw.CloseWriteIfFlushed()
	}
	_ = b.conn.SetReadDeadline(time.Now().Add(lingerTime))
	return true
}
