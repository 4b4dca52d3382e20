package e2eechat

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// filePart is the smallest part the server takes (blob.MinPartSize).
const filePart = 5 << 20

// canaryFile is a file whose every part carries the canary, and whose
// name does too.
func canaryFile(n int) []byte {
	line := []byte(canary + " in a file; ")
	return bytes.Repeat(line, n/len(line)+1)[:n]
}

func testImage(t *testing.T, w, h int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{uint8(x * 3), uint8(y * 5), uint8(x ^ y), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// openFile opens d's history of conv up to message seq and returns that
// one.
func (d *dev) openFile(t *testing.T, conv, seq uint64) (protocol.Message, Opened) {
	t.Helper()
	for _, msg := range d.history(t, conv) {
		o, err := d.m.Open(msg) // in order: a group's sender keys come first
		if msg.Seq == seq {
			if err != nil {
				t.Fatalf("open file message %d: %v", seq, err)
			}
			if o.File == nil {
				t.Fatalf("message %d opened without a file: %+v", seq, o)
			}
			return msg, o
		}
	}
	t.Fatalf("no message %d in conv %d", seq, conv)
	return protocol.Message{}, Opened{}
}

func (d *dev) fetch(t *testing.T, conv, seq uint64, f *File) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := d.m.DownloadFile(ctxT(t), conv, seq, f, &out, t.TempDir()); err != nil {
		t.Fatalf("download file %d: %v", seq, err)
	}
	return out.Bytes()
}

// TestE2EFiles: a file sent in an E2E direct conversation and group is
// opened and decrypted by the other member's devices and the sender's
// other device; the server's data directory (its blobs included) holds
// no byte of its plaintext or name, while a plain conversation's file is
// found there.
func TestE2EFiles(t *testing.T) {
	logs := &syncBuf{}
	srv := servertest.Start(t, servertest.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		servertest.WithConfig(func(c *config.Config) { c.Attach.PartBytes = filePart }))
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	aliceLaptop := startDev(t, srv, "alice", "laptop", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}

	data := canaryFile(2*filePart + 123)
	var last int64
	tmp := t.TempDir()
	ack, sent, err := alice.m.SendFile(ctx, conv.ConvID, bytes.NewReader(data), int64(len(data)), FileOptions{
		Name: canary + "-report.txt", MediaType: "text/plain", Caption: canary + " caption",
		Progress: func(s, _ int64) { last = s }, TempDir: tmp,
	})
	if err != nil {
		t.Fatal(err)
	}
	if last != e2ee.EncryptedSize(int64(len(data))) {
		t.Fatalf("progress ended at %d of a %d-byte ciphertext", last, e2ee.EncryptedSize(int64(len(data))))
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("the ciphertext was left in the temporary directory: %v", left)
	}
	if keys, _ := alice.st.List("fileup/"); len(keys) != 0 {
		t.Fatalf("the upload record outlived the message: %v", keys)
	}
	for name, d := range map[string]*dev{"bob": bob, "alice's laptop": aliceLaptop, "alice": alice} {
		msg, o := d.openFile(t, conv.ConvID, ack.Seq)
		f := o.File
		if msg.Kind != protocol.KindFile || msg.AttachmentID != sent.AttachmentID || f.Name != canary+"-report.txt" ||
			f.Size != int64(len(data)) || f.MediaType != "text/plain" || f.Caption != canary+" caption" || o.Text != f.Caption {
			t.Fatalf("%s opened %+v as %+v", name, msg, f)
		}
		if got := d.fetch(t, conv.ConvID, ack.Seq, f); !bytes.Equal(got, data) {
			t.Fatalf("%s decrypted %d bytes, not the file", name, len(got))
		}
	}
	// The server saw the ciphertext's size and hash, under a made-up name.
	st, err := alice.c.UploadStatus(ctx, sent.AttachmentID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != EncryptedName || st.MediaType != EncryptedMediaType || st.Size != e2ee.EncryptedSize(int64(len(data))) || st.SHA256 != sent.Digest || st.Thumbnail == protocol.ThumbPending {
		t.Fatalf("the server's record of the E2E upload: %+v", st)
	}

	// A picture gets a thumbnail made here, inside the encryption.
	pic := testImage(t, 800, 600)
	pack, psent, err := alice.m.SendFile(ctx, conv.ConvID, bytes.NewReader(pic), int64(len(pic)), FileOptions{Name: "cat.png", MediaType: "image/png"})
	if err != nil {
		t.Fatal(err)
	}
	_, po := bob.openFile(t, conv.ConvID, pack.Seq)
	if po.File.Width != 800 || po.File.Height != 600 || len(po.File.Thumbnail) == 0 || len(po.File.Thumbnail) > MaxThumbnailBytes {
		t.Fatalf("picture: %dx%d, thumbnail of %d bytes", po.File.Width, po.File.Height, len(po.File.Thumbnail))
	}
	if th, err := jpeg.Decode(bytes.NewReader(po.File.Thumbnail)); err != nil || max(th.Bounds().Dx(), th.Bounds().Dy()) > 160 {
		t.Fatalf("thumbnail: %v", err)
	}
	if !bytes.Equal(bob.fetch(t, conv.ConvID, pack.Seq, po.File), pic) || psent.AttachmentID == 0 {
		t.Fatal("the picture did not decrypt to itself")
	}

	// The server's labels are checked: another attachment id is refused.
	msg, _ := bob.openFile(t, conv.ConvID, ack.Seq)
	msg.AttachmentID = psent.AttachmentID
	if _, err := bob.m.Open(msg); !errors.Is(err, ErrMetadataMismatch) {
		t.Fatalf("the file message under another attachment: %v", err)
	}

	// A changed digest or key yields nothing.
	_, o := bob.openFile(t, conv.ConvID, ack.Seq)
	bad := *o.File
	bad.Digest = strings.Repeat("0", 64)
	var out bytes.Buffer
	if err := bob.m.DownloadFile(ctx, conv.ConvID, ack.Seq, &bad, &out, t.TempDir()); !errors.Is(err, e2ee.ErrAttachmentDigest) || out.Len() != 0 {
		t.Fatalf("wrong digest: %v, %d bytes", err, out.Len())
	}
	bad = *o.File
	bad.Key = e2ee.NewAttachmentKey()
	if err := bob.m.DownloadFile(ctx, conv.ConvID, ack.Seq, &bad, &out, t.TempDir()); !errors.Is(err, e2ee.ErrAttachmentMAC) || out.Len() != 0 {
		t.Fatalf("wrong key: %v, %d bytes", err, out.Len())
	}
	// The file of one message does not pass for another's.
	if err := bob.m.DownloadFile(ctx, conv.ConvID, pack.Seq, o.File, &out, t.TempDir()); !errors.Is(err, e2ee.ErrAttachmentDigest) || out.Len() != 0 {
		t.Fatalf("another message's file: %v, %d bytes", err, out.Len())
	}

	// A group: one Sender Key ciphertext carries the file.
	g, err := alice.c.CreateGroupE2E(ctx, "files", []string{"bob"})
	if err != nil {
		t.Fatal(err)
	}
	gack, _, err := alice.m.SendFile(ctx, g.ConvID, bytes.NewReader(data[:5000]), 5000, FileOptions{Name: "g.txt", MediaType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	_, gobj := bob.openFile(t, g.ConvID, gack.Seq)
	if !bytes.Equal(bob.fetch(t, g.ConvID, gack.Seq, gobj.File), data[:5000]) {
		t.Fatal("group file")
	}
	// A recalled file is gone on the receiver's device.
	if _, err := alice.m.Recall(ctx, g.ConvID, gack.Seq); err != nil {
		t.Fatal(err)
	}
	for _, m := range bob.history(t, g.ConvID) {
		if m.Kind == protocol.KindRecall {
			if _, err := bob.m.Open(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range bob.history(t, g.ConvID) {
		if m.Seq == gack.Seq {
			o, err := bob.m.Open(m)
			if err != nil || !o.Recalled || o.File != nil {
				t.Fatalf("recalled file opens as %+v, %v", o, err)
			}
		}
	}

	// A plain conversation's file, in clear: the scan must find it.
	plainConv, err := alice.c.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	ctl := bytes.Repeat([]byte(control+" "), 100)
	info, err := alice.c.Upload(ctx, plainConv.ConvID, bytes.NewReader(ctl), int64(len(ctl)), client.UploadOptions{Name: "control.txt", MediaType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.c.SendFile(ctx, plainConv.ConvID, info.AttachmentID, client.FileMessage{}); err != nil {
		t.Fatal(err)
	}

	srv.Close()
	assertNoCanary(t, srv.DataDir, logs.String())
	if !dirContains(t, srv.DataDir, []byte(control+" "+control)) {
		t.Fatal("the plain file's bytes are not found in the data directory: the scan cannot see blobs")
	}
}

// TestE2EFileResume: a SendFile cut short is resumed by calling it again
// with the same file: same upload, from the part the server has.
func TestE2EFileResume(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) { c.Attach.PartBytes = filePart }))
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	data := canaryFile(2*filePart + 9)
	tmp := t.TempDir()
	cut, stop := context.WithCancel(ctx)
	_, _, err = alice.m.SendFile(cut, conv.ConvID, bytes.NewReader(data), int64(len(data)), FileOptions{
		Name: "big.bin", TempDir: tmp,
		Progress: func(s, _ int64) {
			if s > filePart+10 {
				stop()
			}
		},
	})
	if err == nil {
		t.Fatal("the cut SendFile succeeded")
	}
	keys, err := alice.st.List("fileup/")
	if err != nil || len(keys) != 1 {
		t.Fatalf("records after the cut: %v, %v", keys, err)
	}
	b, _ := alice.st.Load(keys[0])
	var rec pendingFile
	if err := json.Unmarshal(b, &rec); err != nil || rec.AttachmentID == 0 {
		t.Fatalf("record %s: %v", b, err)
	}
	var first int64 = -1
	ack, sent, err := alice.m.SendFile(ctx, conv.ConvID, bytes.NewReader(data), int64(len(data)), FileOptions{
		Name: "big.bin", TempDir: tmp,
		Progress: func(s, _ int64) {
			if first < 0 {
				first = s
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sent.AttachmentID != rec.AttachmentID || first < filePart {
		t.Fatalf("the second SendFile uploaded %d from %d, the cut one was %d", sent.AttachmentID, first, rec.AttachmentID)
	}
	if sent.Digest != rec.Digest || hex.EncodeToString(sent.Key) != hex.EncodeToString(rec.Key) {
		t.Fatal("the resumed file is sealed with another key or digest")
	}
	_, o := bob.openFile(t, conv.ConvID, ack.Seq)
	if !bytes.Equal(bob.fetch(t, conv.ConvID, ack.Seq, o.File), data) {
		t.Fatal("the resumed file does not decrypt to itself")
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("ciphertext left behind: %v", left)
	}
}

// TestE2EFilesS3NoPlaintext: on the S3 engine, after E2E files are sent
// (several parts, a picture), no object of the bucket holds a byte of
// their plaintext or names, while a plain conversation's file is there
// in clear. The node gets a bucket of its own, emptied and removed after.
func TestE2EFilesS3NoPlaintext(t *testing.T) {
	s3cfg := enginetest.S3(t) // skips without PARLEY_TEST_S3, fails under CI=true
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	bucket := "canary-" + hex.EncodeToString(rb[:])
	logs := &syncBuf{}
	srv := servertest.Start(t, servertest.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))),
		servertest.WithConfig(func(c *config.Config) {
			c.Attach.Engine, c.Attach.PartBytes = "s3", filePart
			c.Attach.S3.Endpoint, c.Attach.S3.Bucket, c.Attach.S3.Region = s3cfg.Endpoint, bucket, s3cfg.Region
			c.Attach.S3.AccessKey, c.Attach.S3.SecretKey, c.Attach.S3.Secure = s3cfg.AccessKey, s3cfg.SecretKey, s3cfg.Secure
		}))
	cl, err := minio.New(s3cfg.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s3cfg.AccessKey, s3cfg.SecretKey, ""), Secure: s3cfg.Secure, Region: s3cfg.Region})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for obj := range cl.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
			if obj.Err == nil {
				_ = cl.RemoveObject(ctx, bucket, obj.Key, minio.RemoveObjectOptions{})
			}
		}
		for up := range cl.ListIncompleteUploads(ctx, bucket, "", true) {
			if up.Err == nil {
				_ = cl.RemoveIncompleteUpload(ctx, bucket, up.Key)
			}
		}
		_ = cl.RemoveBucket(ctx, bucket)
	})
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	data := canaryFile(filePart + 4321) // two parts
	ack, _, err := alice.m.SendFile(ctx, conv.ConvID, bytes.NewReader(data), int64(len(data)), FileOptions{Name: canary + ".txt", MediaType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	_, o := bob.openFile(t, conv.ConvID, ack.Seq)
	if !bytes.Equal(bob.fetch(t, conv.ConvID, ack.Seq, o.File), data) {
		t.Fatal("the file did not decrypt to itself through S3")
	}
	plainConv, err := alice.c.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	ctl := bytes.Repeat([]byte(control+" "), 100)
	info, err := alice.c.Upload(ctx, plainConv.ConvID, bytes.NewReader(ctl), int64(len(ctl)), client.UploadOptions{Name: "control.txt", MediaType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.c.SendFile(ctx, plainConv.ConvID, info.AttachmentID, client.FileMessage{}); err != nil {
		t.Fatal(err)
	}

	objects, sawControl := 0, false
	for obj := range cl.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		r, err := cl.GetObject(ctx, bucket, obj.Key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatalf("read %s: %v", obj.Key, err)
		}
		objects++
		if bytes.Contains(b, []byte("CANARY-7f3a9c")) || strings.Contains(obj.Key, "CANARY-7f3a9c") {
			t.Fatalf("plaintext canary in S3 object %s", obj.Key)
		}
		sawControl = sawControl || bytes.Contains(b, []byte(control))
	}
	if objects < 2 || !sawControl {
		t.Fatalf("%d objects, control plaintext found: %v — the scan would prove nothing", objects, sawControl)
	}
	srv.Close()
	assertNoCanary(t, srv.DataDir, logs.String())
}
