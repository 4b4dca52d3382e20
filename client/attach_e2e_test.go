package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// Attachments against a real node: the upload endpoint, the content
// endpoint and the frames are the server's own (embedded disk engine).

// testPart is the smallest part the server takes (blob.MinPartSize).
const testPart = 5 << 20

func attachServer(t *testing.T, edit func(*config.Config)) *servertest.Server {
	return servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Attach.PartBytes = testPart
		if edit != nil {
			edit(c)
		}
	}))
}

func randomFile(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	return b
}

func hexSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// progressLog records Progress calls.
type progressLog struct {
	mu    sync.Mutex
	sent  []int64
	total int64
}

func (p *progressLog) report(sent, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent, p.total = append(p.sent, sent), total
}

func (p *progressLog) calls() ([]int64, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.sent...), p.total
}

func TestE2EAttachmentUploadSendDownload(t *testing.T) {
	srv := attachServer(t, nil)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	carol := startE2E(t, srv.URL, srv.Token("carol"), "phone", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	data := randomFile(1, 2*testPart+1000)
	var prog progressLog
	info, err := alice.Upload(ctx, conv.ConvID, bytes.NewReader(data), int64(len(data)), UploadOptions{Name: "notes.bin", MediaType: "application/octet-stream", Progress: prog.report})
	if err != nil {
		t.Fatal(err)
	}
	if info.State != protocol.UploadComplete || info.Parts != 3 || info.Size != int64(len(data)) || info.SHA256 != hexSHA(data) {
		t.Fatalf("completed upload %+v", info)
	}
	sent, total := prog.calls()
	if total != int64(len(data)) || len(sent) < 4 || sent[len(sent)-1] != total {
		t.Fatalf("progress: %d calls, last %v of %d", len(sent), sent[len(sent)-1:], total)
	}
	for i := 1; i < len(sent); i++ {
		if sent[i] < sent[i-1] {
			t.Fatalf("progress went back without a retry: %v", sent)
		}
	}

	ack, err := alice.SendFile(ctx, conv.ConvID, info.AttachmentID, FileMessage{Caption: "the notes"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "bob has the file message", func() bool { return bob.rec.hasSeq(conv.ConvID, ack.Seq) })
	var msg protocol.Message
	for _, m := range bob.rec.messages(conv.ConvID) {
		if m.Seq == ack.Seq {
			msg = m
		}
	}
	if msg.Kind != protocol.KindFile || msg.AttachmentID != info.AttachmentID {
		t.Fatalf("file message %+v", msg)
	}
	body, err := ParseFileBody(msg)
	if err != nil || body.Name != "notes.bin" || body.Size != int64(len(data)) || body.SHA256 != hexSHA(data) || body.Caption != "the notes" || body.AttachmentID != info.AttachmentID {
		t.Fatalf("file body %+v, %v", body, err)
	}

	var whole bytes.Buffer
	ai, n, err := bob.Download(ctx, conv.ConvID, ack.Seq, &whole, DownloadOptions{})
	if err != nil || n != int64(len(data)) || !bytes.Equal(whole.Bytes(), data) {
		t.Fatalf("download: %d bytes, equal %v, %v", n, bytes.Equal(whole.Bytes(), data), err)
	}
	if ai.AttachmentID != info.AttachmentID || ai.Name != "notes.bin" || ai.Size != int64(len(data)) {
		t.Fatalf("attachment info %+v", ai)
	}
	for _, r := range []struct{ off, n int64 }{{70000, 1234}, {0, 1}, {int64(len(data)) - 10, 0}, {testPart - 5, 10}} {
		var part bytes.Buffer
		_, got, err := bob.Download(ctx, conv.ConvID, ack.Seq, &part, DownloadOptions{Offset: r.off, Length: r.n})
		end := int64(len(data))
		if r.n > 0 {
			end = r.off + r.n
		}
		if err != nil || got != end-r.off || !bytes.Equal(part.Bytes(), data[r.off:end]) {
			t.Fatalf("range %d+%d: %d bytes, %v", r.off, r.n, got, err)
		}
	}
	// The sender downloads it too; someone outside the conversation not.
	if _, _, err := alice.Download(ctx, conv.ConvID, ack.Seq, io.Discard, DownloadOptions{}); err != nil {
		t.Fatalf("sender's download: %v", err)
	}
	if _, _, err := carol.Download(ctx, conv.ConvID, ack.Seq, io.Discard, DownloadOptions{}); CodeOf(err) != protocol.CodeNotMember {
		t.Fatalf("non-member's download: %v", err)
	}
	// A message that is not a file has no attachment.
	txt, err := alice.Send(ctx, conv.ConvID, "no file here")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bob.Download(ctx, conv.ConvID, txt.Seq, io.Discard, DownloadOptions{}); CodeOf(err) != protocol.CodeNotFound {
		t.Fatalf("download of a text message: %v", err)
	}
	// An empty file is one empty part.
	empty, err := alice.Upload(ctx, conv.ConvID, bytes.NewReader(nil), 0, UploadOptions{Name: "empty.txt", MediaType: "text/plain"})
	if err != nil || empty.Parts != 1 || empty.State != protocol.UploadComplete {
		t.Fatalf("empty upload %+v, %v", empty, err)
	}
	eack, err := alice.SendFile(ctx, conv.ConvID, empty.AttachmentID, FileMessage{})
	if err != nil {
		t.Fatal(err)
	}
	if _, n, err := bob.Download(ctx, conv.ConvID, eack.Seq, io.Discard, DownloadOptions{}); err != nil || n != 0 {
		t.Fatalf("empty download: %d, %v", n, err)
	}
}

// TestE2EAttachmentResumeAfterRestart: an upload cut short by closing its
// client is finished by a new Client of the same device, from the part
// after the last one the server has.
func TestE2EAttachmentResumeAfterRestart(t *testing.T) {
	srv := attachServer(t, nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	first := startE2E(t, srv.URL, srv.Token("alice"), "laptop", nil)
	conv, err := first.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	data := randomFile(2, 3*testPart+77)
	var id uint64
	upCtx, stop := context.WithCancel(ctx)
	_, err = first.Upload(upCtx, conv.ConvID, bytes.NewReader(data), int64(len(data)), UploadOptions{
		Name: "movie.bin", MediaType: "video/mp4",
		OnCreate: func(u protocol.UploadInfo) { id = u.AttachmentID },
		Progress: func(sent, _ int64) {
			if sent >= 2*testPart+10 {
				stop() // mid part 3
			}
		},
	})
	if err == nil || id == 0 {
		t.Fatalf("the interrupted upload returned %v (id %d)", err, id)
	}
	first.Close()

	second := startE2E(t, srv.URL, srv.Token("alice"), "laptop", nil)
	st, err := second.UploadStatus(ctx, id)
	if err != nil || st.State != protocol.UploadUploading || st.Received < 2 || st.Received >= st.Parts {
		t.Fatalf("status after the restart %+v, %v", st, err)
	}
	// Another file under the upload's id is refused before a byte goes.
	if _, err := second.ResumeUpload(ctx, id, bytes.NewReader(randomFile(3, len(data))), UploadOptions{}); !errors.Is(err, ErrFileChanged) {
		t.Fatalf("resume with another file: %v", err)
	}
	var prog progressLog
	done, err := second.ResumeUpload(ctx, id, bytes.NewReader(data), UploadOptions{Progress: prog.report})
	if err != nil || done.State != protocol.UploadComplete {
		t.Fatalf("resume: %+v, %v", done, err)
	}
	sent, _ := prog.calls()
	if len(sent) == 0 || sent[0] != int64(st.Received)*testPart {
		t.Fatalf("resume started at %v, want the end of part %d", sent[:1], st.Received)
	}
	// Resuming a complete upload changes nothing.
	if again, err := second.ResumeUpload(ctx, id, bytes.NewReader(data), UploadOptions{}); err != nil || again.State != protocol.UploadComplete {
		t.Fatalf("resume of a complete upload: %+v, %v", again, err)
	}
	ack, err := second.SendFile(ctx, conv.ConvID, id, FileMessage{DurationMS: 1500})
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, _, err := bob.Download(ctx, conv.ConvID, ack.Seq, &got, DownloadOptions{}); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("download of the resumed file: %d bytes, %v", got.Len(), err)
	}
}

func testPNG(t *testing.T, w, h int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), 200, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestE2EAttachmentThumbnail(t *testing.T) {
	srv := attachServer(t, nil)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "phone", nil)
	ctx := ctxT(t)
	g, err := alice.CreateGroup(ctx, "pics", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	pic := testPNG(t, 800, 600)
	info, err := alice.Upload(ctx, g.ConvID, bytes.NewReader(pic), int64(len(pic)), UploadOptions{Name: "cat.png", MediaType: "image/png"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Width != 800 || info.Height != 600 {
		t.Fatalf("image size %dx%d", info.Width, info.Height)
	}
	ack, err := alice.SendFile(ctx, g.ConvID, info.AttachmentID, FileMessage{Caption: "a cat"})
	if err != nil {
		t.Fatal(err)
	}
	var thumb bytes.Buffer
	ai, _, err := bob.Download(ctx, g.ConvID, ack.Seq, &thumb, DownloadOptions{Thumbnail: true})
	if err != nil {
		t.Fatalf("thumbnail: %v", err)
	}
	img, err := jpeg.Decode(&thumb)
	if err != nil {
		t.Fatalf("the thumbnail is not a JPEG: %v", err)
	}
	if b := img.Bounds(); max(b.Dx(), b.Dy()) > 320 || b.Dx()*600 != b.Dy()*800 && abs(b.Dx()*600-b.Dy()*800) > 800 {
		t.Fatalf("thumbnail of %dx%d for an 800x600 image", b.Dx(), b.Dy())
	}
	if ai.Width != 800 || ai.Height != 600 {
		t.Fatalf("attachment info %+v", ai)
	}
	var full bytes.Buffer
	if _, _, err := bob.Download(ctx, g.ConvID, ack.Seq, &full, DownloadOptions{}); err != nil || !bytes.Equal(full.Bytes(), pic) {
		t.Fatalf("full image: %v", err)
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// TestE2EAttachmentLies: the lying cases get their documented codes (as
// the SDK's sentinels) and leave nothing usable behind.
func TestE2EAttachmentLies(t *testing.T) {
	srv := attachServer(t, func(c *config.Config) {
		c.Attach.MaxFileBytes = 12 << 20
		c.Attach.UserQuotaBytes = 18 << 20
		c.Attach.UploadsInFlight = 3
	})
	ctx := ctxT(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "phone", nil)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	data := randomFile(4, testPart+5)

	t.Run("hash mismatch deletes the upload", func(t *testing.T) {
		var id uint64
		_, err := alice.Upload(ctx, conv.ConvID, bytes.NewReader(data), int64(len(data)), UploadOptions{
			Name: "x.bin", MediaType: "application/octet-stream", SHA256: hexSHA([]byte("something else")),
			OnCreate: func(u protocol.UploadInfo) { id = u.AttachmentID },
		})
		if !errors.Is(err, ErrHashMismatch) || CodeOf(err) != protocol.CodeHashMismatch {
			t.Fatalf("upload with a wrong hash: %v", err)
		}
		if _, err := alice.UploadStatus(ctx, id); CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("status of the refused upload: %v", err)
		}
		if _, err := alice.SendFile(ctx, conv.ConvID, id, FileMessage{}); CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("a message naming the refused upload: %v", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		if _, err := alice.UploadCreate(ctx, conv.ConvID, 12<<20+1, hexSHA(nil), "application/octet-stream", "big"); CodeOf(err) != protocol.CodeTooLarge {
			t.Fatalf("upload over max_file_bytes: %v", err)
		}
	})
	t.Run("out of order, incomplete, more bytes than the part", func(t *testing.T) {
		u, err := alice.UploadCreate(ctx, conv.ConvID, int64(len(data)), hexSHA(data), "application/octet-stream", "y.bin")
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			// Finished, so that it counts against no later subtest's limits.
			if _, err := alice.ResumeUpload(ctx, u.AttachmentID, bytes.NewReader(data), UploadOptions{}); err != nil {
				t.Errorf("finishing the upload: %v", err)
			}
		}()
		if _, err := alice.UploadPart(ctx, u.AttachmentID, 2); !errors.Is(err, ErrPartOutOfOrder) {
			t.Fatalf("part 2 before part 1: %v", err)
		}
		if _, err := alice.UploadComplete(ctx, u.AttachmentID); !errors.Is(err, ErrUploadIncomplete) {
			t.Fatalf("completion before any part: %v", err)
		}
		if _, err := alice.SendFile(ctx, conv.ConvID, u.AttachmentID, FileMessage{}); !errors.Is(err, ErrUploadIncomplete) {
			t.Fatalf("a message naming an incomplete upload: %v", err)
		}
		p, err := alice.UploadPart(ctx, u.AttachmentID, 1)
		if err != nil {
			t.Fatal(err)
		}
		target, err := alice.resolve(p.URL)
		if err != nil {
			t.Fatal(err)
		}
		// A byte too many: the node's streamed route refuses a body over
		// the part size from its Content-Length (413 too_large) before
		// the endpoint would (400 size_mismatch); either way nothing is
		// counted.
		more := bytes.NewReader(data[:testPart+1])
		if _, err := alice.put(ctx, target, io.NewSectionReader(more, 0, testPart+1), func(int64) {}); !errors.Is(err, ErrSizeMismatch) && CodeOf(err) != protocol.CodeTooLarge {
			t.Fatalf("a part with a byte too many: %v", err)
		}
		fewer := bytes.NewReader(data[:testPart-1])
		if _, err := alice.put(ctx, target, io.NewSectionReader(fewer, 0, testPart-1), func(int64) {}); !errors.Is(err, ErrSizeMismatch) {
			t.Fatalf("a part with a byte too few: %v", err)
		}
		if st, err := alice.UploadStatus(ctx, u.AttachmentID); err != nil || st.Received != 0 {
			t.Fatalf("after the refused parts: %+v, %v", st, err)
		}
		// A URL whose signature was changed is refused.
		if _, err := alice.put(ctx, target+"x", io.NewSectionReader(bytes.NewReader(data), 0, testPart), func(int64) {}); CodeOf(err) != protocol.CodeUnauthorized {
			t.Fatalf("a PUT with a bad signature: %v", err)
		}
	})
	t.Run("quota", func(t *testing.T) {
		erin := startE2E(t, srv.URL, srv.Token("erin"), "phone", nil)
		ec, err := erin.OpenDirect(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := erin.UploadCreate(ctx, ec.ConvID, 12<<20, hexSHA(nil), "application/octet-stream", "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := erin.UploadCreate(ctx, ec.ConvID, 12<<20, hexSHA(nil), "application/octet-stream", "b"); !errors.Is(err, ErrQuotaExceeded) {
			t.Fatalf("over the quota: %v", err)
		}
	})
	t.Run("uploads in flight", func(t *testing.T) {
		dave := startE2E(t, srv.URL, srv.Token("dave"), "phone", nil)
		dc, err := dave.OpenDirect(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if _, err := dave.UploadCreate(ctx, dc.ConvID, 10, hexSHA(nil), "text/plain", "f"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := dave.UploadCreate(ctx, dc.ConvID, 10, hexSHA(nil), "text/plain", "f"); !errors.Is(err, ErrTooManyUploads) {
			t.Fatalf("a fourth upload in flight: %v", err)
		}
	})
}
