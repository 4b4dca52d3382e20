package blobtest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/blob"
)

// presigner returns the store as a Presigner, or skips the test.
func presigner(t *testing.T, s blob.Store) blob.Presigner {
	t.Helper()
	p, ok := s.(blob.Presigner)
	if !ok {
		t.Skip("the engine does not presign")
	}
	return p
}

// do sends a request with no credentials of any kind.
func do(t *testing.T, method, u string, body []byte, header http.Header) (*http.Response, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctxT(t), method, u, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.ContentLength = int64(len(body))
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func testPresignPart(t *testing.T, e *env) {
	p := presigner(t, e.s)
	ctx := ctxT(t)
	id, err := e.s.Create(ctx, "f/pp")
	if err != nil {
		t.Fatal(err)
	}
	b1, b2 := data(91, blob.MinPartSize), data(92, 4567)
	for n, b := range [][]byte{b1, b2} {
		u, err := p.PresignPart(ctx, "f/pp", id, n+1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			t.Fatalf("PresignPart = %q, want an absolute URL", u)
		}
		resp, body := do(t, http.MethodPut, u, b, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT part %d to the presigned URL: %s %s", n+1, resp.Status, body)
		}
	}
	parts, err := e.s.Parts(ctx, "f/pp", id)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 || parts[0].Size != int64(len(b1)) || parts[1].Size != int64(len(b2)) {
		t.Fatalf("Parts after presigned PUTs = %+v", parts)
	}
	wantAbsent(t, e.s, "f/pp")
	if err := e.s.Complete(ctx, "f/pp", id, parts); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, e.s, "f/pp", append(append([]byte(nil), b1...), b2...))

	// The URL is for that part of that upload only.
	id2, err := e.s.Create(ctx, "f/pq")
	if err != nil {
		t.Fatal(err)
	}
	u, err := p.PresignPart(ctx, "f/pq", id2, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(u, "partNumber=1", "partNumber=2", 1)
	if tampered == u {
		t.Fatalf("presigned part URL %q has no partNumber=1", u)
	}
	if resp, body := do(t, http.MethodPut, tampered, []byte("x"), nil); resp.StatusCode < 400 {
		t.Fatalf("PUT to a presigned URL with another part number: %s %s; want refused", resp.Status, body)
	}
	if parts, err := e.s.Parts(ctx, "f/pq", id2); err != nil || len(parts) != 0 {
		t.Fatalf("Parts after a refused PUT = %+v, %v; want none", parts, err)
	}
}

func testPresignGet(t *testing.T, e *env) {
	p := presigner(t, e.s)
	ctx := ctxT(t)
	b := data(93, 100_000)
	put(t, e.s, "f/pg", b)
	o := blob.GetOptions{
		ContentType:        "image/png",
		ContentDisposition: `attachment; filename*=UTF-8''a%20b%C3%A9.png`,
	}
	u, err := p.PresignGet(ctx, "f/pg", time.Minute, o)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, http.MethodGet, u, nil, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, b) {
		t.Fatalf("GET presigned: %s, %d bytes; want 200 and the object's %d", resp.Status, len(body), len(b))
	}
	if got := resp.Header.Get("Content-Type"); got != o.ContentType {
		t.Errorf("Content-Type = %q, want %q", got, o.ContentType)
	}
	if got := resp.Header.Get("Content-Disposition"); got != o.ContentDisposition {
		t.Errorf("Content-Disposition = %q, want %q", got, o.ContentDisposition)
	}
	resp, body = do(t, http.MethodGet, u, nil, http.Header{"Range": {"bytes=1000-1999"}})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, b[1000:2000]) {
		t.Fatalf("GET presigned with Range: %s, %d bytes; want 206 and 1000", resp.Status, len(body))
	}
	if got, want := resp.Header.Get("Content-Range"), fmt.Sprintf("bytes 1000-1999/%d", len(b)); got != want {
		t.Errorf("Content-Range = %q, want %q", got, want)
	}

	// The signature covers the key and the response headers asked for.
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	put(t, e.s, "f/ph", data(94, 10))
	other := *pu
	other.Path = strings.Replace(pu.Path, "f/pg", "f/ph", 1)
	if resp, _ := do(t, http.MethodGet, other.String(), nil, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET another key with the URL's signature: %s, want 403", resp.Status)
	}
	q := pu.Query()
	q.Set("response-content-type", "text/html")
	other = *pu
	other.RawQuery = q.Encode()
	if resp, _ := do(t, http.MethodGet, other.String(), nil, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET with a changed response-content-type: %s, want 403", resp.Status)
	}
}

func testPresignExpires(t *testing.T, e *env) {
	p := presigner(t, e.s)
	ctx := ctxT(t)
	b := data(95, 1000)
	put(t, e.s, "f/px", b)
	id, err := e.s.Create(ctx, "f/py")
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	get, err := p.PresignGet(ctx, "f/px", ttl, blob.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	part, err := p.PresignPart(ctx, "f/py", id, 1, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, http.MethodGet, get, nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET before the ttl: %s", resp.Status)
	}
	time.Sleep(ttl + 1500*time.Millisecond)
	if resp, _ := do(t, http.MethodGet, get, nil, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET after the ttl: %s, want 403", resp.Status)
	}
	if resp, _ := do(t, http.MethodPut, part, []byte("late"), nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("PUT part after the ttl: %s, want 403", resp.Status)
	}
	if parts, err := e.s.Parts(ctx, "f/py", id); err != nil || len(parts) != 0 {
		t.Fatalf("Parts after an expired PUT = %+v, %v; want none", parts, err)
	}
}
