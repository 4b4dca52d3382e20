package attach

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"image"
	"image/jpeg"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/blob/disk"
	"github.com/parley-im/parley/internal/snowflake"
	"github.com/parley-im/parley/internal/store"
	pstore "github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// Conversations of the fixture: alice, bob (muted) and carol (left) are in
// conv; eve is in none; secret is an E2E conversation of alice's.
const (
	conv   uint64 = 100
	secret uint64 = 200
)

// fixture is a service on Pebble on disk and blob/disk, with a clock the
// test moves, and its upload endpoint on a real HTTP server.
type fixture struct {
	t     *testing.T
	dir   string
	cfg   Config
	st    store.Store
	bs    blob.Store
	svc   *Service
	srv   *httptest.Server
	clock atomic.Int64 // unix ms
	// blobs opens the blob engine (nil: blob/disk under dir).
	blobs func() blob.Store
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.PartBytes = blob.MinPartSize
	cfg.MaxFileBytes = 4 * blob.MinPartSize
	cfg.Key = bytes.Repeat([]byte{7}, KeyBytes)
	return cfg
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	return newFixtureOn(t, cfg, nil)
}

func newFixtureOn(t *testing.T, cfg Config, blobs func() blob.Store) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), cfg: cfg, blobs: blobs}
	f.clock.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMilli())
	f.open()
	ctx := context.Background()
	members := []store.Member{
		{ConvID: conv, UserID: "alice", Role: store.RoleOwner, JoinSeq: 1},
		{ConvID: conv, UserID: "bob", Role: store.RoleMember, JoinSeq: 1},
		{ConvID: conv, UserID: "carol", Role: store.RoleMember, JoinSeq: 1},
	}
	if err := f.st.CreateConversation(ctx, store.Conversation{ID: conv, Kind: store.Group, Members: 3}, members); err != nil {
		t.Fatal(err)
	}
	if err := f.st.SetMuted(ctx, conv, "bob", true); err != nil {
		t.Fatal(err)
	}
	hello := store.Message{ConvID: conv, MsgID: 1, Sender: "alice", SenderDevice: "d1", ClientMsgID: "c1", Kind: protocol.KindText, Body: "hi", ServerTime: 1}
	if _, err := f.st.Append(ctx, store.Append{Msg: hello}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.RemoveMembers(ctx, conv, []string{"carol"}); err != nil {
		t.Fatal(err)
	}
	e2e := []store.Member{{ConvID: secret, UserID: "alice", Role: store.RoleOwner, JoinSeq: 1}}
	if err := f.st.CreateConversation(ctx, store.Conversation{ID: secret, Kind: store.Group, Members: 1, E2E: true}, e2e); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) now() time.Time { return time.UnixMilli(f.clock.Load()) }

func (f *fixture) advance(d time.Duration) { f.clock.Add(d.Milliseconds()) }

// open opens the engines and the service on the fixture's directory (again
// after close: a restarted process).
func (f *fixture) open() {
	t := f.t
	st, err := pstore.Open(context.Background(), pstore.Config{Dir: filepath.Join(f.dir, "store")})
	if err != nil {
		t.Fatal(err)
	}
	var bs blob.Store
	if f.blobs != nil {
		bs = f.blobs()
	} else if bs, err = disk.Open(filepath.Join(f.dir, "blobs")); err != nil {
		t.Fatal(err)
	}
	svc, err := New(f.cfg, st, bs, snowflake.New(1, nil), nil, f.now)
	if err != nil {
		t.Fatal(err)
	}
	f.st, f.bs, f.svc = st, bs, svc
	f.srv = httptest.NewServer(svc.UploadHandler())
	t.Cleanup(f.close)
}

func (f *fixture) close() {
	if f.srv == nil {
		return
	}
	f.srv.Close()
	f.bs.Close()
	f.st.Close()
	f.srv = nil
}

func (f *fixture) do(user string, fr *protocol.Frame) (*protocol.UploadInfo, *protocol.Error) {
	f.t.Helper()
	if perr := protocol.Validate(fr, protocol.DefaultLimits); perr != nil {
		return nil, perr
	}
	resp, perr := f.svc.Handle(context.Background(), protocol.Caller{User: user, Device: "d1"}, fr)
	if perr != nil {
		return nil, perr
	}
	if resp.Type != protocol.TypeUpload || resp.Upload == nil {
		f.t.Fatalf("answer %+v, want an upload", resp)
	}
	return resp.Upload, nil
}

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func (f *fixture) create(user string, cv uint64, size int64, sum, media, name string) (*protocol.UploadInfo, *protocol.Error) {
	return f.do(user, &protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: cv, Size: size, SHA256: sum, MediaType: media, Name: name})
}

func (f *fixture) mustCreate(data []byte) *protocol.UploadInfo {
	f.t.Helper()
	u, perr := f.create("alice", conv, int64(len(data)), hexSum(data), "application/pdf", "report.pdf")
	if perr != nil {
		f.t.Fatalf("upload_create: %v", perr)
	}
	return u
}

func (f *fixture) part(user string, id uint64, n int) (*protocol.UploadInfo, *protocol.Error) {
	return f.do(user, &protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: id, Part: n})
}

func (f *fixture) status(user string, id uint64) (*protocol.UploadInfo, *protocol.Error) {
	return f.do(user, &protocol.Frame{Type: protocol.TypeUploadStatus, AttachmentID: id})
}

func (f *fixture) complete(user string, id uint64) (*protocol.UploadInfo, *protocol.Error) {
	return f.do(user, &protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: id})
}

// put sends body to a part URL; it returns the status and the decoded
// JSON answer.
func (f *fixture) put(url string, body io.Reader, length int64) (int, map[string]any) {
	f.t.Helper()
	if !strings.HasPrefix(url, "http") {
		url = f.srv.URL + url // Parley's endpoint, relative to the node
	}
	req, err := http.NewRequest(http.MethodPut, url, body)
	if err != nil {
		f.t.Fatal(err)
	}
	req.ContentLength = length
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if f.svc.Target() == protocol.TargetS3 {
		_, _ = io.Copy(io.Discard, resp.Body) // S3's own answer
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		f.t.Fatalf("PUT %s: %d, undecodable answer: %v", url, resp.StatusCode, err)
	}
	return resp.StatusCode, m
}

// sendPart asks for part n's URL and PUTs data's bytes of it.
func (f *fixture) sendPart(u *protocol.UploadInfo, data []byte, n int) (int, map[string]any) {
	f.t.Helper()
	p, perr := f.part("alice", u.AttachmentID, n)
	if perr != nil {
		f.t.Fatalf("upload_part %d: %v", n, perr)
	}
	prefix := "/v1/uploads/"
	if f.svc.Target() == protocol.TargetS3 {
		prefix = "http://"
	}
	if p.Part != n || !strings.HasPrefix(p.URL, prefix) || p.URLExpiresAt != f.now().Add(f.cfg.URLTTL).UnixMilli() {
		f.t.Fatalf("upload_part %d answered %+v", n, p)
	}
	b := chunk(data, u.PartSize, n)
	return f.put(p.URL, bytes.NewReader(b), int64(len(b)))
}

func chunk(data []byte, partSize int64, n int) []byte {
	from := int64(n-1) * partSize
	return data[from:min(from+partSize, int64(len(data)))]
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i/7)
	}
	return b
}

// nothingStored checks that upload id left no record, no bytes and no
// usage.
func (f *fixture) nothingStored(id uint64, upload string) {
	f.t.Helper()
	ctx := context.Background()
	if _, err := f.st.Attachment(ctx, id); !errors.Is(err, store.ErrNotFound) {
		f.t.Fatalf("record %d: %v, want not found", id, err)
	}
	if _, err := f.bs.Stat(ctx, FileKey(id)); !errors.Is(err, blob.ErrNotFound) {
		f.t.Fatalf("file %d: %v, want not found", id, err)
	}
	if upload != "" {
		if _, err := f.bs.Parts(ctx, FileKey(id), upload); !errors.Is(err, blob.ErrNotFound) {
			f.t.Fatalf("upload of %d: %v, want not found", id, err)
		}
	}
	if u, err := f.st.AttachmentUsage(ctx, "alice"); err != nil || u != (store.Usage{}) {
		f.t.Fatalf("usage %+v %v, want none", u, err)
	}
	if f.blobs != nil {
		return
	}
	entries, _ := os.ReadDir(filepath.Join(f.dir, "blobs", "uploads"))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			f.t.Fatalf("blobs/uploads holds %s", e.Name())
		}
	}
}

func (f *fixture) record(id uint64) store.Attachment {
	f.t.Helper()
	a, err := f.st.Attachment(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return a
}

func wantCode(t *testing.T, what string, perr *protocol.Error, code protocol.Code) {
	t.Helper()
	if perr == nil || perr.Code != code {
		t.Fatalf("%s: %v, want %s", what, perr, code)
	}
}

// TestUpload: a file of three parts (the last shorter) goes up part by
// part through the signed PUT endpoint and completes; the bytes stored
// are the file's, the record is complete and counted in the owner's usage.
func TestUpload(t *testing.T) {
	f := newFixture(t, testConfig())
	data := payload(2*blob.MinPartSize + 1234)
	u := f.mustCreate(data)
	want := protocol.UploadInfo{AttachmentID: u.AttachmentID, ConvID: conv, Size: int64(len(data)), SHA256: hexSum(data),
		MediaType: "application/pdf", Name: "report.pdf", State: protocol.UploadUploading, PartSize: blob.MinPartSize, Parts: 3,
		ExpiresAt: f.now().Add(24 * time.Hour).UnixMilli(), Target: protocol.TargetParley, Thumbnail: protocol.ThumbNone}
	if *u != want {
		t.Fatalf("upload_create answered\n%+v\nwant\n%+v", *u, want)
	}
	for n := 1; n <= 3; n++ {
		code, ans := f.sendPart(u, data, n)
		if code != 200 || ans["received"] != float64(n) || ans["attachment_id"] != jsonID(u.AttachmentID) || ans["duplicate"] != nil {
			t.Fatalf("PUT part %d: %d %v", n, code, ans)
		}
		if s, perr := f.status("alice", u.AttachmentID); perr != nil || s.Received != n {
			t.Fatalf("upload_status after part %d: %+v %v", n, s, perr)
		}
	}
	f.advance(time.Minute)
	c, perr := f.complete("alice", u.AttachmentID)
	if perr != nil {
		t.Fatal(perr)
	}
	if c.State != protocol.UploadComplete || c.Received != 3 || c.ExpiresAt != f.now().Add(24*time.Hour).UnixMilli() {
		t.Fatalf("upload_complete answered %+v", c)
	}
	// Again: the same answer.
	if again, perr := f.complete("alice", u.AttachmentID); perr != nil || *again != *c {
		t.Fatalf("second upload_complete: %+v %v, want %+v", again, perr, c)
	}
	r, info, err := f.bs.Open(context.Background(), FileKey(u.AttachmentID), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if info.Size != int64(len(data)) || !bytes.Equal(got, data) {
		t.Fatalf("stored %d bytes (info %d), equal %v", len(got), info.Size, bytes.Equal(got, data))
	}
	a := f.record(u.AttachmentID)
	if a.State != store.AttachComplete || a.BlobUpload != "" || a.HashState != nil || a.Owner != "alice" || a.Device != "d1" {
		t.Fatalf("record %+v", a)
	}
	if use, _ := f.st.AttachmentUsage(context.Background(), "alice"); use != (store.Usage{Bytes: int64(len(data))}) {
		t.Fatalf("usage %+v", use)
	}
	// A part after completion is a duplicate; upload_part is refused.
	if _, perr := f.part("alice", u.AttachmentID, 1); perr == nil || perr.Code != protocol.CodeConflict {
		t.Fatalf("upload_part after completion: %v, want conflict", perr)
	}
}

func (f *fixture) receiving(id uint64) bool {
	f.svc.mu.Lock()
	defer f.svc.mu.Unlock()
	return f.svc.mu.receiving[id]
}

func jsonID(id uint64) string {
	b, _ := json.Marshal(struct {
		ID uint64 `json:",string"`
	}{id})
	return strings.Split(string(b), `"`)[3]
}

// TestUploadEmptyFile: a 0-byte file is one empty part.
func TestUploadEmptyFile(t *testing.T) {
	f := newFixture(t, testConfig())
	u := f.mustCreate(nil)
	if u.Parts != 1 {
		t.Fatalf("parts %d, want 1", u.Parts)
	}
	if code, ans := f.sendPart(u, nil, 1); code != 200 || ans["received"] != float64(1) {
		t.Fatalf("PUT: %d %v", code, ans)
	}
	if c, perr := f.complete("alice", u.AttachmentID); perr != nil || c.State != protocol.UploadComplete {
		t.Fatalf("complete: %+v %v", c, perr)
	}
}

// TestUploadCreateRefusals: who may upload where, and the limits; a
// refused upload_create stores nothing.
func TestUploadCreateRefusals(t *testing.T) {
	cfg := testConfig()
	cfg.UserQuotaBytes = 3 * blob.MinPartSize
	cfg.UploadsInFlight = 2
	f := newFixture(t, cfg)
	sum := hexSum([]byte("x"))
	for _, tc := range []struct {
		name  string
		user  string
		cv    uint64
		size  int64
		media string
		fname string
		want  protocol.Code
	}{
		{"non-member", "eve", conv, 1, "text/plain", "a.txt", protocol.CodeNotMember},
		{"no such conversation", "alice", 999, 1, "text/plain", "a.txt", protocol.CodeNotMember},
		{"left", "carol", conv, 1, "text/plain", "a.txt", protocol.CodeNotMember},
		{"muted", "bob", conv, 1, "text/plain", "a.txt", protocol.CodeForbidden},
		{"too large", "alice", conv, cfg.MaxFileBytes + 1, "text/plain", "a.txt", protocol.CodeTooLarge},
		{"E2E with a real type", "alice", secret, 1, "image/png", "encrypted", protocol.CodeInvalidArgument},
		{"E2E with a real name", "alice", secret, 1, E2EMediaType, "cat.png", protocol.CodeInvalidArgument},
		{"over the quota", "alice", conv, cfg.UserQuotaBytes + 1, "text/plain", "a.txt", protocol.CodeQuotaExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, perr := f.create(tc.user, tc.cv, tc.size, sum, tc.media, tc.fname)
			wantCode(t, tc.name, perr, tc.want)
		})
	}
	f.nothingStored(1, "")
	if _, perr := f.create("alice", secret, 1, sum, E2EMediaType, E2EName); perr != nil {
		t.Fatalf("E2E upload: %v", perr)
	}
	if _, perr := f.create("alice", conv, 2*blob.MinPartSize, sum, "text/plain", "a.txt"); perr != nil {
		t.Fatal(perr)
	}
	// Two in flight: a third is refused; so is one past the quota.
	_, perr := f.create("alice", conv, 1, sum, "text/plain", "a.txt")
	wantCode(t, "third upload in flight", perr, protocol.CodeTooManyUploads)
	if use, _ := f.st.AttachmentUsage(context.Background(), "alice"); use != (store.Usage{Bytes: 2*blob.MinPartSize + 1, Inflight: 2}) {
		t.Fatalf("usage %+v", use)
	}
	// Another user's uploads are not found.
	list, _ := f.st.ConvAttachments(context.Background(), conv, 0, 10)
	if len(list) != 1 {
		t.Fatalf("records %+v", list)
	}
	for _, ask := range []func(string, uint64) (*protocol.UploadInfo, *protocol.Error){f.status, f.complete} {
		_, perr := ask("bob", list[0].ID)
		wantCode(t, "another user's upload", perr, protocol.CodeNotFound)
	}
	_, perr = f.part("bob", list[0].ID, 1)
	wantCode(t, "another user's part", perr, protocol.CodeNotFound)
}

// TestLyingClient: a part with more or fewer bytes than it has is refused
// and not counted; a part out of order is refused with how far the upload
// got; completion before every part is refused; a file whose bytes do not
// hash to the declared SHA-256 is refused and deleted, record and bytes.
func TestLyingClient(t *testing.T) {
	f := newFixture(t, testConfig())
	data := payload(blob.MinPartSize + 10)
	u := f.mustCreate(data)
	p1, _ := f.part("alice", u.AttachmentID, 1)
	part1 := chunk(data, u.PartSize, 1)

	// More bytes than the part has, declared or not.
	long := append(append([]byte{}, part1...), 'x')
	if code, ans := f.put(p1.URL, bytes.NewReader(long), int64(len(long))); code != 400 || ans["code"] != "size_mismatch" {
		t.Fatalf("long part (Content-Length): %d %v", code, ans)
	}
	if code, ans := f.put(p1.URL, io.MultiReader(bytes.NewReader(long)), -1); code != 400 || ans["code"] != "size_mismatch" {
		t.Fatalf("long part (chunked): %d %v", code, ans)
	}
	// Fewer.
	if code, ans := f.put(p1.URL, bytes.NewReader(part1[:100]), 100); code != 400 || ans["code"] != "size_mismatch" {
		t.Fatalf("short part: %d %v", code, ans)
	}
	if code, ans := f.put(p1.URL, io.MultiReader(bytes.NewReader(part1[:100])), -1); code != 400 || ans["code"] != "size_mismatch" {
		t.Fatalf("short part (chunked): %d %v", code, ans)
	}
	if s, _ := f.status("alice", u.AttachmentID); s.Received != 0 {
		t.Fatalf("received %d after refused parts", s.Received)
	}
	// Out of order: the URL is refused, and a signed URL for it cannot
	// be had; a PUT of it (forged by replaying the signing) says how far.
	_, perr := f.part("alice", u.AttachmentID, 2)
	wantCode(t, "upload_part 2 before 1", perr, protocol.CodePartOutOfOrder)
	_, perr = f.part("alice", u.AttachmentID, 3)
	wantCode(t, "upload_part beyond the parts", perr, protocol.CodeInvalidArgument)
	exp := f.now().Add(time.Minute).UnixMilli()
	code, ans := f.put(f.svc.partURL(u.AttachmentID, 2, exp), bytes.NewReader(data[blob.MinPartSize:]), 10)
	if code != 409 || ans["code"] != "part_out_of_order" || ans["received"] != float64(0) {
		t.Fatalf("PUT part 2 before 1: %d %v", code, ans)
	}
	_, perr = f.complete("alice", u.AttachmentID)
	wantCode(t, "complete before the parts", perr, protocol.CodeUploadIncomplete)

	// Part 1, then the same again: a duplicate, nothing written.
	if code, ans := f.put(p1.URL, bytes.NewReader(part1), int64(len(part1))); code != 200 || ans["received"] != float64(1) {
		t.Fatalf("part 1: %d %v", code, ans)
	}
	if code, ans := f.put(p1.URL, bytes.NewReader(bytes.Repeat([]byte{0}, len(part1))), int64(len(part1))); code != 200 || ans["duplicate"] != true || ans["received"] != float64(1) {
		t.Fatalf("part 1 again: %d %v", code, ans)
	}
	_, perr = f.complete("alice", u.AttachmentID)
	wantCode(t, "complete before part 2", perr, protocol.CodeUploadIncomplete)

	// URLs: a forged signature, another part's signature, an expired one.
	for _, bad := range []string{
		strings.Replace(p1.URL, "sig=", "sig=A", 1),
		strings.Replace(p1.URL, "/parts/1?", "/parts/2?", 1),
		strings.Replace(p1.URL, "exp=", "exp=1", 1),
	} {
		if code, ans := f.put(bad, bytes.NewReader(data[blob.MinPartSize:]), 10); code != 401 || ans["code"] != "unauthorized" {
			t.Fatalf("PUT %s: %d %v", bad, code, ans)
		}
	}
	f.advance(f.cfg.URLTTL + time.Second)
	if code, ans := f.put(p1.URL, bytes.NewReader(part1), int64(len(part1))); code != 401 || ans["code"] != "unauthorized" {
		t.Fatalf("expired URL: %d %v", code, ans)
	}

	// The last part with bytes other than the file's: the hash lies.
	p2, _ := f.part("alice", u.AttachmentID, 2)
	if code, ans := f.put(p2.URL, strings.NewReader("0123456789"), 10); code != 200 || ans["received"] != float64(2) {
		t.Fatalf("part 2: %d %v", code, ans)
	}
	upload := f.record(u.AttachmentID).BlobUpload
	_, perr = f.complete("alice", u.AttachmentID)
	wantCode(t, "complete with the wrong bytes", perr, protocol.CodeHashMismatch)
	f.nothingStored(u.AttachmentID, upload)
	_, perr = f.status("alice", u.AttachmentID)
	wantCode(t, "status of a deleted upload", perr, protocol.CodeNotFound)
}

// TestUploadResume: a client restarted mid-upload asks upload_status and
// goes on from the next part; so does one whose server restarted (the
// store, the blob engine and the service opened again: the hash state
// carried in the record continues).
func TestUploadResume(t *testing.T) {
	f := newFixture(t, testConfig())
	data := payload(3*blob.MinPartSize + 77)
	u := f.mustCreate(data)
	if code, _ := f.sendPart(u, data, 1); code != 200 {
		t.Fatal(code)
	}
	// The client restarts: it knows only the attachment id.
	s, perr := f.status("alice", u.AttachmentID)
	if perr != nil || s.Received != 1 || s.State != protocol.UploadUploading {
		t.Fatalf("status: %+v %v", s, perr)
	}
	if code, _ := f.sendPart(u, data, s.Received+1); code != 200 {
		t.Fatal(code)
	}
	// The server restarts.
	f.close()
	f.open()
	s, perr = f.status("alice", u.AttachmentID)
	if perr != nil || s.Received != 2 {
		t.Fatalf("status after restart: %+v %v", s, perr)
	}
	for n := s.Received + 1; n <= s.Parts; n++ {
		if code, ans := f.sendPart(u, data, n); code != 200 {
			t.Fatalf("part %d: %d %v", n, code, ans)
		}
	}
	if c, perr := f.complete("alice", u.AttachmentID); perr != nil || c.State != protocol.UploadComplete {
		t.Fatalf("complete: %+v %v", c, perr)
	}
}

// TestOnePartAtATime: a PUT of an upload whose part is being received is
// refused conflict, so the hash state stays the stored bytes'.
func TestOnePartAtATime(t *testing.T) {
	f := newFixture(t, testConfig())
	data := payload(100)
	u := f.mustCreate(data)
	p, _ := f.part("alice", u.AttachmentID, 1)
	pr, pw := io.Pipe()
	done := make(chan int)
	go func() {
		code, _ := f.put(p.URL, pr, 100)
		done <- code
	}()
	if _, err := pw.Write(data[:50]); err != nil {
		t.Fatal(err)
	}
	for !f.receiving(u.AttachmentID) { // the first PUT is being received
		time.Sleep(time.Millisecond)
	}
	code, ans := f.put(p.URL, bytes.NewReader(data), 100)
	if code != 409 || ans["code"] != "conflict" {
		t.Fatalf("concurrent PUT: %d %v", code, ans)
	}
	_, _ = pw.Write(data[50:])
	pw.Close()
	if code := <-done; code != 200 {
		t.Fatalf("first PUT: %d", code)
	}
	if c, perr := f.complete("alice", u.AttachmentID); perr != nil || c.State != protocol.UploadComplete {
		t.Fatalf("complete: %+v %v", c, perr)
	}
}

// TestGC: past unattached_ttl an upload not completed is aborted and
// deleted, a completed file named by no message deleted; a record a
// message names stays.
func TestGC(t *testing.T) {
	cfg := testConfig()
	cfg.UnattachedTTL = time.Hour
	f := newFixture(t, cfg)
	ctx := context.Background()
	data := payload(blob.MinPartSize + 5)
	partial := f.mustCreate(data)
	if code, _ := f.sendPart(partial, data, 1); code != 200 {
		t.Fatal(code)
	}
	small := payload(10)
	done := f.mustCreate(small)
	f.sendPart(done, small, 1)
	if _, perr := f.complete("alice", done.AttachmentID); perr != nil {
		t.Fatal(perr)
	}
	kept := f.mustCreate(small)
	f.sendPart(kept, small, 1)
	if _, perr := f.complete("alice", kept.AttachmentID); perr != nil {
		t.Fatal(perr)
	}
	a := f.record(kept.AttachmentID)
	attached := a
	attached.State, attached.ExpiresAt, attached.RefClientMsgID = store.AttachAttached, 0, "m1"
	if err := f.st.UpdateAttachment(ctx, attached, a); err != nil {
		t.Fatal(err)
	}
	upload := f.record(partial.AttachmentID).BlobUpload

	f.advance(59 * time.Minute)
	if n := f.svc.GC(ctx); n != 0 {
		t.Fatalf("GC before the ttl deleted %d", n)
	}
	f.advance(2 * time.Minute)
	if n := f.svc.GC(ctx); n != 2 {
		t.Fatalf("GC after the ttl deleted %d, want 2", n)
	}
	for _, id := range []uint64{partial.AttachmentID, done.AttachmentID} {
		if _, err := f.st.Attachment(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("record %d: %v", id, err)
		}
		if _, err := f.bs.Stat(ctx, FileKey(id)); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("file %d: %v", id, err)
		}
	}
	if _, err := f.bs.Parts(ctx, FileKey(partial.AttachmentID), upload); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("upload: %v", err)
	}
	if a := f.record(kept.AttachmentID); a.State != store.AttachAttached {
		t.Fatalf("attached record %+v", a)
	}
	if _, err := f.bs.Stat(ctx, FileKey(kept.AttachmentID)); err != nil {
		t.Fatalf("attached file: %v", err)
	}
	if use, _ := f.st.AttachmentUsage(ctx, "alice"); use != (store.Usage{Bytes: int64(len(small))}) {
		t.Fatalf("usage %+v", use)
	}
	// A record left deleting (a crash between its steps) is finished.
	a = f.record(kept.AttachmentID)
	del := a
	del.State = store.AttachDeleting
	if err := f.st.UpdateAttachment(ctx, del, a); err != nil {
		t.Fatal(err)
	}
	if n := f.svc.GC(ctx); n != 1 {
		t.Fatalf("GC of a deleting record deleted %d", n)
	}
	f.nothingStored(kept.AttachmentID, "")
}

func pngBytes(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = byte(i)
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestThumbnails: an image of a plain conversation gets its dimensions at
// completion and a thumbnail made off the request path (t/<id>, a JPEG);
// one over max_image_pixels, or not the image it claims to be, is refused
// without being decoded; a thumbnail left pending (a crash) is made again
// after the GC finds it.
func TestThumbnails(t *testing.T) {
	cfg := testConfig()
	cfg.MaxImagePixels = 400 * 300
	f := newFixture(t, cfg)
	ctx := context.Background()
	up := func(data []byte, media string) *protocol.UploadInfo {
		t.Helper()
		u, perr := f.create("alice", conv, int64(len(data)), hexSum(data), media, "picture")
		if perr != nil {
			t.Fatal(perr)
		}
		if code, ans := f.sendPart(u, data, 1); code != 200 {
			t.Fatalf("PUT: %d %v", code, ans)
		}
		c, perr := f.complete("alice", u.AttachmentID)
		if perr != nil {
			t.Fatal(perr)
		}
		return c
	}
	img := up(pngBytes(t, 400, 300), "image/png")
	if img.Width != 400 || img.Height != 300 || img.Thumbnail != protocol.ThumbPending {
		t.Fatalf("image: %+v", img)
	}
	big := up(pngBytes(t, 401, 300), "image/png")
	if big.Width != 401 || big.Thumbnail != protocol.ThumbRefused {
		t.Fatalf("over max_image_pixels: %+v", big)
	}
	fake := up([]byte("<svg onload=alert(1)>"), "image/png")
	if fake.Width != 0 || fake.Thumbnail != protocol.ThumbRefused {
		t.Fatalf("not an image: %+v", fake)
	}
	doc := up([]byte("hello"), "text/plain")
	if doc.Thumbnail != protocol.ThumbNone {
		t.Fatalf("not an image type: %+v", doc)
	}
	// The worker makes the queued one.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { f.svc.Run(rctx); close(done) }()
	waitThumb := func(id uint64) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); f.record(id).Thumb != store.ThumbReady; {
			if time.Now().After(deadline) {
				t.Fatalf("thumbnail of %d still %d", id, f.record(id).Thumb)
			}
			time.Sleep(10 * time.Millisecond)
		}
		r, info, err := f.bs.Open(ctx, ThumbKey(id), 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		c, err := jpeg.DecodeConfig(r)
		if err != nil || max(c.Width, c.Height) != f.cfg.ThumbnailPx || info.Size == 0 {
			t.Fatalf("thumbnail: %+v %v (%d bytes)", c, err, info.Size)
		}
	}
	waitThumb(img.AttachmentID)
	cancel()
	<-done
	for _, id := range []uint64{big.AttachmentID, fake.AttachmentID, doc.AttachmentID} {
		if _, err := f.bs.Stat(ctx, ThumbKey(id)); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("thumbnail of %d: %v", id, err)
		}
	}
	// A thumbnail left pending by a crash: made again by a restarted
	// process once the GC sees it, past the grace after its upload began.
	again := up(pngBytes(t, 40, 30), "image/png")
	f.close()
	f.open()
	if a := f.record(again.AttachmentID); a.Thumb != store.ThumbPending {
		t.Fatalf("before the restart's GC: %+v", a)
	}
	f.advance(thumbGrace)
	rctx, cancel = context.WithCancel(ctx)
	defer cancel()
	go f.svc.Run(rctx)
	for deadline := time.Now().Add(20 * time.Second); f.record(again.AttachmentID).Thumb != store.ThumbReady; {
		if time.Now().After(deadline) {
			t.Fatal("a pending thumbnail was not made after a restart")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
