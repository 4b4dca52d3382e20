package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/third_party/nbio/nbhttp"

	"github.com/parley-im/parley/internal/gateway"
)

// streamServer serves h on the event loop with the gateway's engine
// settings, streaming the bodies of PUT /stream/ up to limit bytes.
func streamServer(t *testing.T, limit int64, h http.Handler) string {
	t.Helper()
	if raceBuild {
		t.Skip("the event loop's HTTP server runs without -race only; scripts/test.sh runs this package again without it")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.EngineConfig(gateway.DefaultConfig(), ln, h)
	cfg.StreamBody = func(method, path string) (int64, bool) {
		return limit, method == http.MethodPut && len(path) > len("/stream/") && path[:len("/stream/")] == "/stream/"
	}
	e := nbhttp.NewEngine(cfg)
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Shutdown(t.Context()) })
	return "http://" + ln.Addr().String()
}

// TestStreamedBodyIsFlowControlled: a 64 MiB PUT to a streamed route
// reaches a slow handler whole and in order, the handler runs before the
// body is in, and the client is held back by TCP flow control rather than
// buffered: it is never more than the kernel's socket buffers and the
// stream's high-water mark ahead of the handler (unpaused, it would be
// ahead by nearly the whole body).
func TestStreamedBodyIsFlowControlled(t *testing.T) {
	const size = 64 << 20
	var started atomic.Int64 // bytes the client had written when the handler began
	var written, consumed, ahead atomic.Int64
	url := streamServer(t, size, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Store(written.Load())
		h := sha256.New()
		buf := make([]byte, 16<<10)
		var n int64
		for {
			k, err := r.Body.Read(buf)
			h.Write(buf[:k])
			n += int64(k)
			consumed.Store(n)
			if a := written.Load() - n; a > ahead.Load() {
				ahead.Store(a)
			}
			if n%(2<<20) < int64(k) {
				time.Sleep(20 * time.Millisecond) // a slow disk
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	}))
	body := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	sum := sha256.Sum256(body)
	req, _ := http.NewRequest(http.MethodPut, url+"/stream/x", &countingReader{r: bytes.NewReader(body), n: &written})
	req.ContentLength = size
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if want := strconv.Itoa(size) + " " + hex.EncodeToString(sum[:]); resp.StatusCode != 200 || string(got) != want {
		t.Fatalf("answer %d %q, want 200 %q", resp.StatusCode, got, want)
	}
	if s := started.Load(); s >= size {
		t.Errorf("the handler began after the whole body (%d bytes) was sent", s)
	}
	// Loopback socket buffers hold a few MiB each way (tcp_rmem, tcp_wmem).
	if a := ahead.Load(); a > 24<<20 {
		t.Errorf("the client got %d MiB ahead of the handler: the body was buffered, not flow-controlled", a>>20)
	}
	t.Logf("the client was at most %d KiB ahead of the handler", ahead.Load()>>10)
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestStreamedBodyLimitsAndEarlyAnswers: over the route's limit is 413
// before the handler runs; a handler that answers before reading the body
// is read by the client, not reset; a client that goes away mid-body makes
// the handler's read fail with io.ErrUnexpectedEOF; other routes keep the
// frame-sized body bound.
func TestStreamedBodyLimitsAndEarlyAnswers(t *testing.T) {
	gotErr := make(chan error, 1)
	url := streamServer(t, 8<<20, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream/early":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, "refused early")
		case "/stream/cut":
			_, err := io.Copy(io.Discard, r.Body)
			gotErr <- err
		default:
			_, _ = io.Copy(io.Discard, r.Body)
		}
	}))
	put := func(path string, n int) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPut, url+path, bytes.NewReader(make([]byte, n)))
		req.ContentLength = int64(n)
		return http.DefaultClient.Do(req)
	}
	resp, err := put("/stream/big", 9<<20)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("over the limit: %v %v, want 413", resp, err)
	}
	resp.Body.Close()
	for i := range 5 {
		resp, err := put("/stream/early", 8<<20)
		if err != nil {
			t.Fatalf("try %d, an early answer: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || string(b) != "refused early" {
			t.Fatalf("try %d, an early answer: %d %q", i, resp.StatusCode, b)
		}
	}
	resp, err = put("/other", 1<<20)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("an unstreamed route: %v %v, want 413", resp, err)
	}
	resp.Body.Close()

	c, err := net.Dial("tcp", url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fmt.Fprintf(c, "PUT /stream/cut HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
	_, _ = c.Write(make([]byte, 300000))
	time.Sleep(50 * time.Millisecond)
	_ = c.Close()
	select {
	case err := <-gotErr:
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("a body cut short read %v, want io.ErrUnexpectedEOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler of a body cut short never returned")
	}
}

// TestLongResponseToASlowReader: a 64 MiB response written in 32 KiB
// writes reaches a client that reads slowly, whole: the writer waits for
// the client instead of queueing past the outbound bound (which closes
// the connection).
func TestLongResponseToASlowReader(t *testing.T) {
	const size = 64 << 20
	url := streamServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		buf := make([]byte, 32<<10)
		for i := range buf {
			buf[i] = byte(i)
		}
		for n := 0; n < size; n += len(buf) {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	}))
	resp, err := http.Get(url + "/long")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var n int64
	buf := make([]byte, 64<<10)
	for {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if n%(8<<20) < int64(k) {
			time.Sleep(30 * time.Millisecond)
		}
		if err != nil {
			break
		}
	}
	if n != size {
		t.Fatalf("read %d of %d bytes", n, size)
	}
}

// TestRangeResponseEndsAtItsLength: http.ServeContent answering a Range
// request (io.CopyN into the response) sends exactly the range, so the
// next answer on the keep-alive connection is the next request's; the
// event loop once sent the rest of the content after it.
func TestRangeResponseEndsAtItsLength(t *testing.T) {
	content := make([]byte, 1<<20)
	for i := range content {
		content[i] = byte(i * 7)
	}
	url := streamServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/next" {
			_, _ = w.Write([]byte("next"))
			return
		}
		// A ReadSeeker that is no *os.File (the blob engines' readers).
		http.ServeContent(w, r, "", time.Time{}, struct{ io.ReadSeeker }{bytes.NewReader(content)})
	}))
	c, err := net.Dial("tcp", url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /file HTTP/1.1\r\nHost: x\r\nRange: bytes=100-199\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	first, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(first.Body)
	if first.StatusCode != http.StatusPartialContent || !bytes.Equal(body, content[100:200]) {
		t.Fatalf("range: %d, %d bytes", first.StatusCode, len(body))
	}
	second, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the answer after the range: %v", err)
	}
	body, _ = io.ReadAll(second.Body)
	if second.StatusCode != http.StatusOK || string(body) != "next" {
		t.Fatalf("the answer after the range: %d %q", second.StatusCode, body)
	}
}

// TestStaleEventSparesNewConnection: a streamed request's connection is
// closed by its handler's goroutine after the answer, while the client,
// told Connection: close, hangs up and opens a new connection for its
// next request — which the kernel gives the descriptor just freed. The
// event loop's event for the old connection's hang-up must not close the
// new one: every request on a fresh connection gets its answer.
func TestStaleEventSparesNewConnection(t *testing.T) {
	url := streamServer(t, 1<<20, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
		if f, ok := w.(http.Flusher); ok && r.Method == http.MethodPut {
			// The answer goes out, and the client hangs up, before this
			// goroutine closes the connection.
			f.Flush()
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		}
	}))
	const workers, rounds = 8, 150
	var failed atomic.Int64
	var firstErr atomic.Value
	done := make(chan struct{})
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			body := bytes.Repeat([]byte{'x'}, 64<<10)
			for range rounds {
				for _, m := range []string{http.MethodPut, http.MethodPost} {
					path := "/rpc"
					if m == http.MethodPut {
						path = "/stream/x"
					}
					req, _ := http.NewRequest(m, url+path, bytes.NewReader(body))
					req.Close = m == http.MethodPost // a fresh connection each time
					tr := &http.Transport{DisableKeepAlives: true}
					resp, err := (&http.Client{Transport: tr}).Do(req)
					if err == nil {
						_, err = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Sprintf("%s %s: %v", m, path, err))
					}
				}
			}
		}()
	}
	for range workers {
		<-done
	}
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed; the first: %v", n, 2*workers*rounds, firstErr.Load())
	}
}
