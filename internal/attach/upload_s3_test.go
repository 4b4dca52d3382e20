package attach

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/blob"
	blobs3 "github.com/parley-im/parley/internal/blob/s3"
	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/protocol"
)

// s3Fixture is the fixture on the S3 server of $PARLEY_TEST_S3 (skips
// without it, fails under CI=true): parts go to presigned URLs.
func s3Fixture(t *testing.T) *fixture {
	t.Helper()
	s3cfg := enginetest.S3(t)
	f := newFixtureOn(t, testConfig(), func() blob.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		bs, err := blobs3.Open(ctx, s3cfg)
		if err != nil {
			t.Fatal(err)
		}
		return bs
	})
	// The S3 server checks presigned URLs against its own clock.
	f.clock.Store(time.Now().UnixMilli())
	return f
}

// TestUploadS3: on S3 the parts go to presigned URLs, received is counted
// from the parts the server holds, completion joins them and hashes the
// object read back; a part with the wrong size is not counted, and a file
// whose hash lies is deleted with its record.
func TestUploadS3(t *testing.T) {
	f := s3Fixture(t)
	ctx := context.Background()
	data := payload(2*blob.MinPartSize + 99)
	u := f.mustCreate(data)
	if u.Target != protocol.TargetS3 || u.Parts != 3 {
		t.Fatalf("upload %+v", u)
	}
	_, perr := f.part("alice", u.AttachmentID, 2)
	wantCode(t, "part 2 before 1", perr, protocol.CodePartOutOfOrder)
	if code, _ := f.sendPart(u, data, 1); code != 200 {
		t.Fatalf("part 1: %d", code)
	}
	// Part 2 with too few bytes: S3 takes it, Parley does not count it.
	p2, _ := f.part("alice", u.AttachmentID, 2)
	short := chunk(data, u.PartSize, 2)[:1000]
	if code, _ := f.put(p2.URL, bytes.NewReader(short), int64(len(short))); code != 200 {
		t.Fatalf("short part 2: %d", code)
	}
	if s, perr := f.status("alice", u.AttachmentID); perr != nil || s.Received != 1 {
		t.Fatalf("status after a short part: %+v %v", s, perr)
	}
	_, perr = f.complete("alice", u.AttachmentID)
	wantCode(t, "complete with a short part", perr, protocol.CodeUploadIncomplete)
	for n := 2; n <= 3; n++ {
		if code, _ := f.sendPart(u, data, n); code != 200 {
			t.Fatalf("part %d: %d", n, code)
		}
	}
	if s, _ := f.status("alice", u.AttachmentID); s.Received != 3 {
		t.Fatalf("received %d, want 3", s.Received)
	}
	c, perr := f.complete("alice", u.AttachmentID)
	if perr != nil || c.State != protocol.UploadComplete {
		t.Fatalf("complete: %+v %v", c, perr)
	}
	r, info, err := f.bs.Open(ctx, FileKey(u.AttachmentID), 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if info.Size != int64(len(data)) {
		t.Fatalf("stored %d bytes", info.Size)
	}

	// The hash lies: the bytes sent are not the declared file's.
	lie := payload(100)
	l, perr := f.create("alice", conv, 100, hexSum([]byte("something else")), "text/plain", "lie.txt")
	if perr != nil {
		t.Fatal(perr)
	}
	if code, _ := f.sendPart(l, lie, 1); code != 200 {
		t.Fatal(code)
	}
	upload := f.record(l.AttachmentID).BlobUpload
	_, perr = f.complete("alice", l.AttachmentID)
	wantCode(t, "complete with the wrong bytes", perr, protocol.CodeHashMismatch)
	if _, err := f.bs.Stat(ctx, FileKey(l.AttachmentID)); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("lying file: %v", err)
	}
	if _, err := f.bs.Parts(ctx, FileKey(l.AttachmentID), upload); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("lying upload: %v", err)
	}
	if _, err := f.st.Attachment(ctx, l.AttachmentID); err == nil {
		t.Fatal("the lying upload's record is still there")
	}
}

// TestCompleteAfterJoin: a completion cut short after the engine joined
// the parts (on S3 the read-back outlasting the request; a crash before
// the record was written) is finished by the client's retry: the object
// is checked and the upload completes. On disk and on S3.
func TestCompleteAfterJoin(t *testing.T) {
	for name, mk := range map[string]func(t *testing.T) *fixture{
		"disk": func(t *testing.T) *fixture { return newFixture(t, testConfig()) },
		"s3":   s3Fixture,
	} {
		t.Run(name, func(t *testing.T) {
			f := mk(t)
			ctx := context.Background()
			data := payload(blob.MinPartSize + 321)
			u := f.mustCreate(data)
			for n := 1; n <= u.Parts; n++ {
				if code, _ := f.sendPart(u, data, n); code != 200 {
					t.Fatalf("part %d: %d", n, code)
				}
			}
			// The engine joins the parts; the record still says uploading.
			key := FileKey(u.AttachmentID)
			upload := f.record(u.AttachmentID).BlobUpload
			parts, err := f.bs.Parts(ctx, key, upload)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.bs.Complete(ctx, key, upload, parts); err != nil {
				t.Fatal(err)
			}
			c, perr := f.complete("alice", u.AttachmentID)
			if perr != nil || c.State != protocol.UploadComplete {
				t.Fatalf("upload_complete after the engine joined the parts: %+v %v", c, perr)
			}
			r, info, err := f.bs.Open(ctx, key, 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			_, _ = got.ReadFrom(r)
			r.Close()
			if info.Size != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("stored %d bytes, not the file", info.Size)
			}
		})
	}
}

// gatedS3 is the S3 engine whose whole-object reads wait for gate once
// held is set: a read back as slow as wanted.
type gatedS3 struct {
	*blobs3.Store
	held atomic.Bool
	gate chan struct{}
}

func (g *gatedS3) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, blob.Info, error) {
	if g.held.Load() {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, blob.Info{}, ctx.Err()
		}
	}
	return g.Store.Open(ctx, key, off, n)
}

// TestCompleteReadBackOutlastsRequest: on S3 a read back that outlasts
// the request answers not_ready (with retry_after_ms) and goes on off the
// request path; upload_status says uploading with every part received;
// the next upload_complete answers its outcome — complete, or
// hash_mismatch for a file whose hash lies (deleted meanwhile).
func TestCompleteReadBackOutlastsRequest(t *testing.T) {
	s3cfg := enginetest.S3(t)
	var g *gatedS3
	f := newFixtureOn(t, testConfig(), func() blob.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		bs, err := blobs3.Open(ctx, s3cfg)
		if err != nil {
			t.Fatal(err)
		}
		g = &gatedS3{Store: bs, gate: make(chan struct{})}
		return g
	})
	f.clock.Store(time.Now().UnixMilli())
	short := func(id uint64) *protocol.Error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, perr := f.svc.Handle(ctx, protocol.Caller{User: "alice", Device: "d1"}, &protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: id})
		return perr
	}
	data := payload(blob.MinPartSize + 77)
	for _, lie := range []bool{false, true} {
		sum := hexSum(data)
		if lie {
			sum = hexSum(append([]byte("not "), data...))
		}
		u, perr := f.create("alice", conv, int64(len(data)), sum, "application/pdf", "report.pdf")
		if perr != nil {
			t.Fatal(perr)
		}
		for n := 1; n <= u.Parts; n++ {
			if code, _ := f.sendPart(u, data, n); code != 200 {
				t.Fatalf("part %d: %d", n, code)
			}
		}
		g.gate = make(chan struct{})
		g.held.Store(true)
		perr = short(u.AttachmentID)
		if perr == nil || perr.Code != protocol.CodeNotReady || perr.RetryAfter <= 0 {
			t.Fatalf("lie %v: upload_complete with the read back held: %v, want not_ready with retry_after_ms", lie, perr)
		}
		if again := short(u.AttachmentID); again == nil || again.Code != protocol.CodeNotReady {
			t.Fatalf("lie %v: upload_complete again with the read back held: %v, want not_ready", lie, again)
		}
		st, perr := f.status("alice", u.AttachmentID)
		if perr != nil || st.State != protocol.UploadUploading || st.Received != st.Parts {
			t.Fatalf("lie %v: upload_status during the read back: %+v %v", lie, st, perr)
		}
		g.held.Store(false)
		close(g.gate)
		c, perr := f.complete("alice", u.AttachmentID)
		if lie {
			if perr == nil || perr.Code != protocol.CodeHashMismatch {
				t.Fatalf("upload_complete of a lying file after its read back: %+v %v, want hash_mismatch", c, perr)
			}
			if _, perr := f.status("alice", u.AttachmentID); perr == nil || perr.Code != protocol.CodeNotFound {
				t.Fatalf("upload_status of the lying file: %v, want not_found", perr)
			}
			continue
		}
		if perr != nil || c.State != protocol.UploadComplete {
			t.Fatalf("upload_complete after the read back: %+v %v", c, perr)
		}
	}
}
