// Package blobtest is the conformance suite of blob.Store. Every engine
// runs it unchanged (Run), so it uses nothing but the interface, and
// blob.Presigner where the engine implements it.
//
// Run's subtests run one after another, each on a fresh store from
// Harness.Open; several start many goroutines on one store, so the suite
// also checks the engine's concurrency contract (run it with -race).
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/blob"
)

// Harness opens stores for the suite.
type Harness struct {
	// Open returns a new, empty store.
	Open func(t *testing.T) blob.Store
	// Reopen, if set, closes s and opens the same data again (the Reopen
	// subtest skips without it).
	Reopen func(t *testing.T, s blob.Store) blob.Store
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"PutOpen", testPutOpen},
		{"PutEmpty", testPutEmpty},
		{"PutReplace", testPutReplace},
		{"PutSizeMismatch", testPutSizeMismatch},
		{"PutHashMismatch", testPutHashMismatch},
		{"PutReaderError", testPutReaderError},
		{"PutCanceled", testPutCanceled},
		{"Ranges", testRanges},
		{"NotFound", testNotFound},
		{"Delete", testDelete},
		{"Keys", testKeys},
		{"BadKeys", testBadKeys},
		{"Multipart", testMultipart},
		{"MultipartReplacePart", testMultipartReplacePart},
		{"MultipartPartSize", testMultipartPartSize},
		{"MultipartBadParts", testMultipartBadParts},
		{"MultipartEmpty", testMultipartEmpty},
		{"MultipartReplacesObject", testMultipartReplacesObject},
		{"MultipartUnknown", testMultipartUnknown},
		{"Abort", testAbort},
		{"ConcurrentPuts", testConcurrentPuts},
		{"ConcurrentParts", testConcurrentParts},
		{"Reopen", testReopen},
		{"Closed", testClosed},
		{"PresignPart", testPresignPart},
		{"PresignGet", testPresignGet},
		{"PresignExpires", testPresignExpires},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{h: h}
			e.s = e.open(t)
			tc.fn(t, e)
		})
	}
}

// env is one subtest's store.
type env struct {
	h Harness
	s blob.Store
}

func (e *env) open(t *testing.T) blob.Store {
	t.Helper()
	s := e.h.Open(t)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// data returns n deterministic pseudo-random bytes for seed (random, so
// that no engine gains from compression or deduplication).
func data(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n - n%8; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func put(t *testing.T, s blob.Store, key string, b []byte) {
	t.Helper()
	if err := s.Put(ctxT(t), key, bytes.NewReader(b), int64(len(b)), sha256.Sum256(b)); err != nil {
		t.Fatalf("Put(%q, %d bytes): %v", key, len(b), err)
	}
}

// read returns the bytes [off, off+n) of key and the Info Open gave.
func read(t *testing.T, s blob.Store, key string, off, n int64) ([]byte, blob.Info) {
	t.Helper()
	rc, info, err := s.Open(ctxT(t), key, off, n)
	if err != nil {
		t.Fatalf("Open(%q, %d, %d): %v", key, off, n, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Open(%q, %d, %d): read: %v", key, off, n, err)
	}
	return b, info
}

// wantBytes checks that key holds exactly want.
func wantBytes(t *testing.T, s blob.Store, key string, want []byte) {
	t.Helper()
	got, info := read(t, s, key, 0, -1)
	if info.Size != int64(len(want)) {
		t.Fatalf("Open(%q): Info.Size = %d, want %d", key, info.Size, len(want))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Open(%q): got %d bytes, want %d bytes (%s)", key, len(got), len(want), firstDiff(got, want))
	}
	st, err := s.Stat(ctxT(t), key)
	if err != nil {
		t.Fatalf("Stat(%q): %v", key, err)
	}
	if st.Size != int64(len(want)) {
		t.Fatalf("Stat(%q).Size = %d, want %d", key, st.Size, len(want))
	}
}

func firstDiff(a, b []byte) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d", i)
		}
	}
	return "one is a prefix of the other"
}

// wantAbsent checks that key holds no object.
func wantAbsent(t *testing.T, s blob.Store, key string) {
	t.Helper()
	if info, err := s.Stat(ctxT(t), key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat(%q) = %+v, %v; want ErrNotFound", key, info, err)
	}
	if rc, _, err := s.Open(ctxT(t), key, 0, -1); !errors.Is(err, blob.ErrNotFound) {
		if err == nil {
			rc.Close()
		}
		t.Fatalf("Open(%q): %v, want ErrNotFound", key, err)
	}
}

func testPutOpen(t *testing.T, e *env) {
	b := data(1, 300_000)
	put(t, e.s, "f/1", b)
	wantBytes(t, e.s, "f/1", b)
}

func testPutEmpty(t *testing.T, e *env) {
	put(t, e.s, "f/empty", nil)
	wantBytes(t, e.s, "f/empty", nil)
	got, info := read(t, e.s, "f/empty", 0, 10)
	if len(got) != 0 || info.Size != 0 {
		t.Fatalf("Open(empty, 0, 10) = %d bytes, size %d; want none, 0", len(got), info.Size)
	}
}

func testPutReplace(t *testing.T, e *env) {
	put(t, e.s, "f/1", data(1, 5000))
	b := data(2, 1234)
	put(t, e.s, "f/1", b)
	wantBytes(t, e.s, "f/1", b)
}

// lies are readers that do not hold what Put is told: each must fail with
// its error and leave the key as it was.
func testPutSizeMismatch(t *testing.T, e *env) {
	old := data(1, 4096)
	put(t, e.s, "f/old", old)
	b := data(2, 100_000)
	sum := sha256.Sum256(b)
	cases := []struct {
		name string
		r    io.Reader
		size int64
		sum  [32]byte
	}{
		{"more bytes", bytes.NewReader(b), int64(len(b)) - 1, sha256.Sum256(b[:len(b)-1])},
		{"many more bytes", bytes.NewReader(b), 1000, sha256.Sum256(b[:1000])},
		{"fewer bytes", bytes.NewReader(b[:len(b)-1]), int64(len(b)), sum},
		{"no bytes", bytes.NewReader(nil), int64(len(b)), sum},
		{"bytes for an empty object", bytes.NewReader(b[:1]), 0, sha256.Sum256(nil)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, key := range []string{"f/new", "f/old"} {
				err := e.s.Put(ctxT(t), key, c.r, c.size, c.sum)
				if !errors.Is(err, blob.ErrSize) {
					t.Fatalf("Put(%q) = %v, want ErrSize", key, err)
				}
				if s, ok := c.r.(io.Seeker); ok {
					_, _ = s.Seek(0, io.SeekStart)
				}
			}
			wantAbsent(t, e.s, "f/new")
			wantBytes(t, e.s, "f/old", old)
		})
	}
}

func testPutHashMismatch(t *testing.T, e *env) {
	old := data(1, 4096)
	put(t, e.s, "f/old", old)
	for _, n := range []int{0, 1, 70_000} {
		b := data(3, n)
		sum := sha256.Sum256(b)
		sum[31] ^= 1
		for _, key := range []string{"f/new", "f/old"} {
			if err := e.s.Put(ctxT(t), key, bytes.NewReader(b), int64(n), sum); !errors.Is(err, blob.ErrHash) {
				t.Fatalf("Put(%q, %d bytes, wrong sum) = %v, want ErrHash", key, n, err)
			}
		}
		wantAbsent(t, e.s, "f/new")
		wantBytes(t, e.s, "f/old", old)
	}
}

// failingReader returns its bytes, then err.
type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

func testPutReaderError(t *testing.T, e *env) {
	old := data(1, 4096)
	put(t, e.s, "f/old", old)
	b := data(2, 50_000)
	boom := errors.New("reader broke")
	for _, key := range []string{"f/new", "f/old"} {
		r := &failingReader{r: bytes.NewReader(b[:20_000]), err: boom}
		if err := e.s.Put(ctxT(t), key, r, int64(len(b)), sha256.Sum256(b)); err == nil {
			t.Fatalf("Put(%q) of a reader that fails = nil, want an error", key)
		}
	}
	wantAbsent(t, e.s, "f/new")
	wantBytes(t, e.s, "f/old", old)
}

// cancelingReader cancels its context after its first read.
type cancelingReader struct {
	r      io.Reader
	cancel context.CancelFunc
	once   sync.Once
}

func (c *cancelingReader) Read(p []byte) (int, error) {
	if len(p) > 4096 {
		p = p[:4096]
	}
	n, err := c.r.Read(p)
	c.once.Do(func() {
		c.cancel()
		time.Sleep(50 * time.Millisecond)
	})
	return n, err
}

func testPutCanceled(t *testing.T, e *env) {
	b := data(2, 2<<20)
	ctx, cancel := context.WithCancel(ctxT(t))
	r := &cancelingReader{r: bytes.NewReader(b), cancel: cancel}
	if err := e.s.Put(ctx, "f/new", r, int64(len(b)), sha256.Sum256(b)); err == nil {
		t.Fatal("Put with a context canceled while writing = nil, want an error")
	}
	wantAbsent(t, e.s, "f/new")
}

func testRanges(t *testing.T, e *env) {
	b := data(4, 1000)
	put(t, e.s, "f/r", b)
	cases := []struct {
		off, n int64
		want   []byte
	}{
		{0, -1, b},
		{0, 1000, b},
		{0, 10, b[:10]},
		{500, 100, b[500:600]},
		{999, 1, b[999:]},
		{990, -1, b[990:]},
		{990, 100, b[990:]},
		{10, 0, nil},
		{1000, -1, nil},
		{1000, 5, nil},
		{2000, 5, nil},
		{2000, -1, nil},
	}
	for _, c := range cases {
		got, info := read(t, e.s, "f/r", c.off, c.n)
		if info.Size != 1000 {
			t.Errorf("Open(off %d, n %d): Info.Size = %d, want 1000", c.off, c.n, info.Size)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("Open(off %d, n %d): got %d bytes, want %d", c.off, c.n, len(got), len(c.want))
		}
	}
}

func testNotFound(t *testing.T, e *env) {
	wantAbsent(t, e.s, "f/none")
	if rc, _, err := e.s.Open(ctxT(t), "f/none", 10, 5); !errors.Is(err, blob.ErrNotFound) {
		if err == nil {
			rc.Close()
		}
		t.Fatalf("Open(absent, 10, 5) = %v, want ErrNotFound", err)
	}
}

func testDelete(t *testing.T, e *env) {
	if err := e.s.Delete(ctxT(t), "f/none"); err != nil {
		t.Fatalf("Delete(absent) = %v, want nil", err)
	}
	put(t, e.s, "f/1", data(1, 10))
	put(t, e.s, "f/2", data(2, 10))
	if err := e.s.Delete(ctxT(t), "f/1"); err != nil {
		t.Fatal(err)
	}
	wantAbsent(t, e.s, "f/1")
	wantBytes(t, e.s, "f/2", data(2, 10))
	if err := e.s.Delete(ctxT(t), "f/1"); err != nil {
		t.Fatalf("second Delete = %v, want nil", err)
	}
	put(t, e.s, "f/1", data(3, 7))
	wantBytes(t, e.s, "f/1", data(3, 7))
}

// testKeys stores keys that a naive mapping onto paths would confuse.
func testKeys(t *testing.T, e *env) {
	keys := []string{
		"a", "a/b", "a/b/c", "A", "a.b", "a_b", "a-b", "f/123", "t/123",
		"x/y", "z", ".z", "z.", "z/.y", "-", "_",
		strings.Repeat("k", 200),
		strings.Repeat("d/", 99) + "dd",
	}
	for i, k := range keys {
		if !blob.ValidKey(k) {
			t.Fatalf("ValidKey(%q) = false; the suite's key list is wrong", k)
		}
		put(t, e.s, k, data(uint64(100+i), 10+i))
	}
	for i, k := range keys {
		wantBytes(t, e.s, k, data(uint64(100+i), 10+i))
	}
}

func testBadKeys(t *testing.T, e *env) {
	ctx := ctxT(t)
	up, err := e.s.Create(ctx, "f/good")
	if err != nil {
		t.Fatal(err)
	}
	bad := []string{"", "/a", "a/", "a//b", "./a", "a/./b", "a/.", ".", "a/../b", "..", "a..b", "a b", "a\x00", "a\n", "ü", "a?b", "a%2F", "a\\b", strings.Repeat("k", 201)}
	for _, k := range bad {
		if blob.ValidKey(k) {
			t.Fatalf("ValidKey(%q) = true; the suite's key list is wrong", k)
		}
		check := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, blob.ErrBadKey) {
				t.Errorf("%s(%q) = %v, want ErrBadKey", op, k, err)
			}
		}
		check("Put", e.s.Put(ctx, k, bytes.NewReader(nil), 0, sha256.Sum256(nil)))
		_, _, err := e.s.Open(ctx, k, 0, -1)
		check("Open", err)
		_, err = e.s.Stat(ctx, k)
		check("Stat", err)
		check("Delete", e.s.Delete(ctx, k))
		_, err = e.s.Create(ctx, k)
		check("Create", err)
		_, err = e.s.PutPart(ctx, k, up, 1, bytes.NewReader(nil), 0)
		check("PutPart", err)
		_, err = e.s.Parts(ctx, k, up)
		check("Parts", err)
		check("Complete", e.s.Complete(ctx, k, up, []blob.Part{{N: 1}}))
		check("Abort", e.s.Abort(ctx, k, up))
	}
}

// upload puts parts (in order) into a new upload of key and returns its id
// and the parts as PutPart returned them.
func upload(t *testing.T, s blob.Store, key string, parts ...[]byte) (string, []blob.Part) {
	t.Helper()
	ctx := ctxT(t)
	id, err := s.Create(ctx, key)
	if err != nil {
		t.Fatalf("Create(%q): %v", key, err)
	}
	if id == "" {
		t.Fatalf("Create(%q) returned an empty upload id", key)
	}
	var got []blob.Part
	for i, b := range parts {
		p := putPart(t, s, key, id, i+1, b)
		got = append(got, p)
	}
	return id, got
}

func putPart(t *testing.T, s blob.Store, key, id string, n int, b []byte) blob.Part {
	t.Helper()
	p, err := s.PutPart(ctxT(t), key, id, n, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("PutPart(%q, part %d, %d bytes): %v", key, n, len(b), err)
	}
	if p.N != n || p.Size != int64(len(b)) || p.ETag == "" {
		t.Fatalf("PutPart(part %d, %d bytes) = %+v", n, len(b), p)
	}
	return p
}

// wantParts checks that Parts lists exactly want.
func wantParts(t *testing.T, s blob.Store, key, id string, want []blob.Part) {
	t.Helper()
	got, err := s.Parts(ctxT(t), key, id)
	if err != nil {
		t.Fatalf("Parts(%q): %v", key, err)
	}
	if len(got) != len(want) {
		t.Fatalf("Parts(%q) = %+v, want %+v", key, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("Parts(%q)[%d] = %+v, want %+v", key, i, got[i], want[i])
		}
	}
}

func testMultipart(t *testing.T, e *env) {
	p1, p2, p3 := data(11, blob.MinPartSize), data(12, blob.MinPartSize), data(13, 12345)
	id, parts := upload(t, e.s, "f/m", p1, p2, p3)
	wantParts(t, e.s, "f/m", id, parts)
	wantAbsent(t, e.s, "f/m")
	if err := e.s.Complete(ctxT(t), "f/m", id, parts); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := append(append(append([]byte(nil), p1...), p2...), p3...)
	wantBytes(t, e.s, "f/m", want)
	got, _ := read(t, e.s, "f/m", blob.MinPartSize-10, 20)
	if !bytes.Equal(got, want[blob.MinPartSize-10:blob.MinPartSize+10]) {
		t.Fatal("a range across the parts' boundary reads other bytes")
	}
	if _, err := e.s.Parts(ctxT(t), "f/m", id); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Parts after Complete = %v, want ErrNotFound", err)
	}

	// One part, smaller than MinPartSize, is a whole upload.
	b := data(14, 100)
	id, parts = upload(t, e.s, "f/one", b)
	if err := e.s.Complete(ctxT(t), "f/one", id, parts); err != nil {
		t.Fatalf("Complete of one small part: %v", err)
	}
	wantBytes(t, e.s, "f/one", b)
}

func testMultipartReplacePart(t *testing.T, e *env) {
	p1 := data(21, blob.MinPartSize)
	id, parts := upload(t, e.s, "f/m", p1, data(22, 1000))
	// S3 servers that keep every copy of a part sent again (SeaweedFS)
	// tell the copies apart by their time, in whole seconds.
	time.Sleep(1100 * time.Millisecond)
	p2 := putPart(t, e.s, "f/m", id, 2, data(23, 2000))
	if p2.ETag == parts[1].ETag {
		t.Fatalf("a replaced part kept its ETag %q", p2.ETag)
	}
	wantParts(t, e.s, "f/m", id, []blob.Part{parts[0], p2})
	// The part list from before the replacement no longer matches.
	if err := e.s.Complete(ctxT(t), "f/m", id, parts); !errors.Is(err, blob.ErrBadParts) {
		t.Fatalf("Complete with a replaced part's old ETag = %v, want ErrBadParts", err)
	}
	listed, err := e.s.Parts(ctxT(t), "f/m", id)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.Complete(ctxT(t), "f/m", id, listed); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, e.s, "f/m", append(append([]byte(nil), p1...), data(23, 2000)...))
}

func testMultipartPartSize(t *testing.T, e *env) {
	ctx := ctxT(t)
	id, parts := upload(t, e.s, "f/m", data(31, 3000))
	b := data(32, 5000)
	for _, c := range []struct {
		name string
		n    int
		r    io.Reader
		size int64
	}{
		{"more bytes, new part", 2, bytes.NewReader(b), 4999},
		{"fewer bytes, new part", 2, bytes.NewReader(b[:4999]), 5000},
		{"more bytes, replacing", 1, bytes.NewReader(b), 4000},
		{"fewer bytes, replacing", 1, bytes.NewReader(b[:10]), 5000},
	} {
		if _, err := e.s.PutPart(ctx, "f/m", id, c.n, c.r, c.size); !errors.Is(err, blob.ErrSize) {
			t.Fatalf("%s: PutPart = %v, want ErrSize", c.name, err)
		}
		wantParts(t, e.s, "f/m", id, parts)
	}
	if err := e.s.Complete(ctx, "f/m", id, parts); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, e.s, "f/m", data(31, 3000))
}

func testMultipartBadParts(t *testing.T, e *env) {
	ctx := ctxT(t)
	big1, big2, small := data(41, blob.MinPartSize), data(42, blob.MinPartSize), data(43, 1000)
	id, parts := upload(t, e.s, "f/m", big1, big2, small)
	// An upload whose first part is below MinPartSize can only complete
	// as that part alone.
	sid, sparts := upload(t, e.s, "f/s", small, small)
	wrongSize, wrongTag := parts[2], parts[2]
	wrongSize.Size++
	wrongTag.ETag = parts[1].ETag
	cases := []struct {
		name  string
		key   string
		id    string
		parts []blob.Part
	}{
		{"no parts", "f/m", id, nil},
		{"gap", "f/m", id, []blob.Part{parts[0], parts[2]}},
		{"not from 1", "f/m", id, []blob.Part{parts[1], parts[2]}},
		{"out of order", "f/m", id, []blob.Part{parts[1], parts[0], parts[2]}},
		{"twice", "f/m", id, []blob.Part{parts[0], parts[0], parts[2]}},
		{"wrong size", "f/m", id, []blob.Part{parts[0], parts[1], wrongSize}},
		{"wrong etag", "f/m", id, []blob.Part{parts[0], parts[1], wrongTag}},
		{"missing part", "f/m", id, []blob.Part{parts[0], parts[1], parts[2], {N: 4, Size: 10, ETag: parts[2].ETag}}},
		{"small part before the last", "f/s", sid, sparts},
	}
	for _, c := range cases {
		if err := e.s.Complete(ctx, c.key, c.id, c.parts); !errors.Is(err, blob.ErrBadParts) {
			t.Errorf("%s: Complete = %v, want ErrBadParts", c.name, err)
		}
		wantAbsent(t, e.s, c.key)
	}
	// The refusals left the upload as it was.
	wantParts(t, e.s, "f/m", id, parts)
	if err := e.s.Complete(ctx, "f/m", id, parts); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, e.s, "f/m", append(append(append([]byte(nil), big1...), big2...), small...))
}

func testMultipartEmpty(t *testing.T, e *env) {
	id, parts := upload(t, e.s, "f/e", nil)
	wantParts(t, e.s, "f/e", id, parts)
	if err := e.s.Complete(ctxT(t), "f/e", id, parts); err != nil {
		t.Fatalf("Complete of one empty part: %v", err)
	}
	wantBytes(t, e.s, "f/e", nil)
}

func testMultipartReplacesObject(t *testing.T, e *env) {
	old := data(51, 777)
	put(t, e.s, "f/x", old)
	b := data(52, 4321)
	id, parts := upload(t, e.s, "f/x", b)
	wantBytes(t, e.s, "f/x", old)
	if err := e.s.Complete(ctxT(t), "f/x", id, parts); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, e.s, "f/x", b)
}

func testMultipartUnknown(t *testing.T, e *env) {
	ctx := ctxT(t)
	id, parts := upload(t, e.s, "f/a", data(61, 10))
	for _, c := range []struct{ key, id string }{
		{"f/a", "0123456789abcdef0123456789abcdef"},
		{"f/a", "not-an-upload"},
		{"f/a", ""},
		{"f/b", id}, // another key's upload
	} {
		if _, err := e.s.Parts(ctx, c.key, c.id); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Parts(%q, %q) = %v, want ErrNotFound", c.key, c.id, err)
		}
		if _, err := e.s.PutPart(ctx, c.key, c.id, 1, bytes.NewReader([]byte("x")), 1); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("PutPart(%q, %q) = %v, want ErrNotFound", c.key, c.id, err)
		}
		if err := e.s.Complete(ctx, c.key, c.id, parts); !errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Complete(%q, %q) = %v, want ErrNotFound", c.key, c.id, err)
		}
		if err := e.s.Abort(ctx, c.key, c.id); err != nil {
			t.Errorf("Abort(%q, %q) = %v, want nil", c.key, c.id, err)
		}
	}
	wantAbsent(t, e.s, "f/b")
	wantParts(t, e.s, "f/a", id, parts)
}

func testAbort(t *testing.T, e *env) {
	ctx := ctxT(t)
	id, parts := upload(t, e.s, "f/a", data(71, blob.MinPartSize), data(72, 10))
	if err := e.s.Abort(ctx, "f/a", id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Parts(ctx, "f/a", id); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Parts after Abort = %v, want ErrNotFound", err)
	}
	if err := e.s.Complete(ctx, "f/a", id, parts); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Complete after Abort = %v, want ErrNotFound", err)
	}
	if _, err := e.s.PutPart(ctx, "f/a", id, 3, bytes.NewReader([]byte("x")), 1); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("PutPart after Abort = %v, want ErrNotFound", err)
	}
	if err := e.s.Abort(ctx, "f/a", id); err != nil {
		t.Fatalf("second Abort = %v, want nil", err)
	}
	wantAbsent(t, e.s, "f/a")
	// Other uploads of the same key are not touched.
	id2, parts2 := upload(t, e.s, "f/a", data(73, 10))
	id3, parts3 := upload(t, e.s, "f/a", data(74, 20))
	if err := e.s.Abort(ctx, "f/a", id2); err != nil {
		t.Fatal(err)
	}
	wantParts(t, e.s, "f/a", id3, parts3)
	_ = parts2
}

func testConcurrentPuts(t *testing.T, e *env) {
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			b := data(uint64(1000+i), 20_000+i*997)
			key := fmt.Sprintf("f/c%d", i)
			if err := e.s.Put(ctxT(t), key, bytes.NewReader(b), int64(len(b)), sha256.Sum256(b)); err != nil {
				errs <- fmt.Errorf("Put(%s): %w", key, err)
			}
		})
	}
	// The same key from many writers: one whole version wins.
	for i := range 8 {
		wg.Go(func() {
			b := data(uint64(2000+i), 50_000)
			if err := e.s.Put(ctxT(t), "f/same", bytes.NewReader(b), int64(len(b)), sha256.Sum256(b)); err != nil {
				errs <- fmt.Errorf("Put(f/same): %w", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range n {
		wantBytes(t, e.s, fmt.Sprintf("f/c%d", i), data(uint64(1000+i), 20_000+i*997))
	}
	got, _ := read(t, e.s, "f/same", 0, -1)
	for i := range 8 {
		if bytes.Equal(got, data(uint64(2000+i), 50_000)) {
			return
		}
	}
	t.Fatalf("f/same holds %d bytes that no writer wrote whole", len(got))
}

func testConcurrentParts(t *testing.T, e *env) {
	ctx := ctxT(t)
	const n = 4
	id, err := e.s.Create(ctx, "f/p")
	if err != nil {
		t.Fatal(err)
	}
	chunks := make([][]byte, n)
	parts := make([]blob.Part, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		size := blob.MinPartSize
		if i == n-1 {
			size = 3333
		}
		chunks[i] = data(uint64(3000+i), size)
		wg.Go(func() {
			p, err := e.s.PutPart(ctx, "f/p", id, i+1, bytes.NewReader(chunks[i]), int64(size))
			if err != nil {
				errs <- err
				return
			}
			parts[i] = p
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	wantParts(t, e.s, "f/p", id, parts)
	if err := e.s.Complete(ctx, "f/p", id, parts); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, e.s, "f/p", bytes.Join(chunks, nil))
}

func testReopen(t *testing.T, e *env) {
	if e.h.Reopen == nil {
		t.Skip("the harness does not reopen")
	}
	b := data(81, 10_000)
	put(t, e.s, "f/1", b)
	p1 := data(82, blob.MinPartSize)
	id, parts := upload(t, e.s, "f/2", p1)
	e.s = e.h.Reopen(t, e.s)
	t.Cleanup(func() { _ = e.s.Close() })
	wantBytes(t, e.s, "f/1", b)
	wantParts(t, e.s, "f/2", id, parts)
	parts = append(parts, putPart(t, e.s, "f/2", id, 2, data(83, 10)))
	if err := e.s.Complete(ctxT(t), "f/2", id, parts); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, e.s, "f/2", append(append([]byte(nil), p1...), data(83, 10)...))
}

func testClosed(t *testing.T, e *env) {
	ctx := ctxT(t)
	put(t, e.s, "f/1", data(1, 10))
	id, parts := upload(t, e.s, "f/2", data(2, 10))
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, blob.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", op, err)
		}
	}
	check("Put", e.s.Put(ctx, "f/1", bytes.NewReader(nil), 0, sha256.Sum256(nil)))
	_, _, err := e.s.Open(ctx, "f/1", 0, -1)
	check("Open", err)
	_, err = e.s.Stat(ctx, "f/1")
	check("Stat", err)
	check("Delete", e.s.Delete(ctx, "f/1"))
	_, err = e.s.Create(ctx, "f/3")
	check("Create", err)
	_, err = e.s.PutPart(ctx, "f/2", id, 2, bytes.NewReader(nil), 0)
	check("PutPart", err)
	_, err = e.s.Parts(ctx, "f/2", id)
	check("Parts", err)
	check("Complete", e.s.Complete(ctx, "f/2", id, parts))
	check("Abort", e.s.Abort(ctx, "f/2", id))
	if err := e.s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}
