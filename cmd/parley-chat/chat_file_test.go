package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// cliPart is the smallest part the server takes (blob.MinPartSize).
const cliPart = 5 << 20

func pngFile(t *testing.T, w, h int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), 90, 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func startKeyedCLI(t *testing.T, ctx context.Context, url, token, keys string) *chatCLI {
	t.Helper()
	in, feed := io.Pipe()
	c := &chatCLI{t: t, out: &syncBuffer{}, feed: feed, done: make(chan error, 1)}
	go func() {
		c.done <- runChat(ctx, []string{"-url", url, "-token", token, "-device", "cli", "-keys", keys}, in, c.out)
	}()
	t.Cleanup(func() { feed.Close() })
	return c
}

// TestChatCLIFile: /file sends a picture and a file of several parts to a
// plain conversation, an incoming file prints with its name, size and
// type, /save writes it, and /file of a file whose upload was interrupted
// resumes that upload.
func TestChatCLIFile(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) { c.Attach.PartBytes = cliPart }))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bob := startSDKUser(t, ctx, srv, "bob")
	keys := t.TempDir()
	cli := startKeyedCLI(t, ctx, srv.URL, srv.Token("alice"), keys)
	cli.do("/dm bob", "* conv ")
	cli.do("hi bob", "alice: hi bob") // seq 1: not a file
	dir := t.TempDir()
	pic := filepath.Join(dir, "cat.png")
	if err := os.WriteFile(pic, pngFile(t, 80, 60), 0o600); err != nil {
		t.Fatal(err)
	}
	cli.do("/file "+pic, "alice: 📎 cat.png (")
	cli.do("/history 1", "image/png 80×60)")
	ev := bob.wait(t, "the picture", func(ev client.Event) bool {
		return ev.Kind == client.EventMessage && ev.Message.Kind == protocol.KindFile
	})
	conv := ev.ConvID
	body, err := client.ParseFileBody(*ev.Message)
	if err != nil || body.Name != "cat.png" || body.MediaType != "image/png" || body.Width != 80 {
		t.Fatalf("bob's file message %+v, %v", body, err)
	}

	// bob sends a text file; it prints for alice and /save writes it.
	notes := bytes.Repeat([]byte("line of notes\n"), 20000) // 280,000 bytes
	info, err := bob.Upload(ctx, conv, bytes.NewReader(notes), int64(len(notes)), client.UploadOptions{Name: "notes.txt", MediaType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := bob.SendFile(ctx, conv, info.AttachmentID, client.FileMessage{Caption: "read these"})
	if err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(ack.Seq, 10)
	waitOutput(t, cli.out, "bob: 📎 notes.txt (273 KiB, text/plain) read these")
	saveDir := t.TempDir()
	cli.do("/save "+seq+" "+saveDir, "* saved notes.txt (273 KiB)")
	if got, err := os.ReadFile(filepath.Join(saveDir, "notes.txt")); err != nil || !bytes.Equal(got, notes) {
		t.Fatalf("saved file: %d bytes, %v", len(got), err)
	}
	cli.do("/save "+seq+" "+saveDir, "exists")
	cli.do("/save 1", "is not a file")

	// An upload of big.bin cut short after one part (as a killed
	// parley-chat leaves it): /file big.bin resumes it.
	big := bytes.Repeat([]byte("0123456789abcdef"), 2*cliPart/16+3) // 3 parts
	bigPath := filepath.Join(dir, "big.bin")
	if err := os.WriteFile(bigPath, big, 0o600); err != nil {
		t.Fatal(err)
	}
	cut, stop := context.WithCancel(ctx)
	var id uint64
	tablet := startSDKDevice(t, ctx, srv, "alice", "tablet")
	_, err = tablet.Upload(cut, conv, bytes.NewReader(big), int64(len(big)), client.UploadOptions{
		Name: "big.bin", MediaType: "application/octet-stream",
		OnCreate: func(u protocol.UploadInfo) { id = u.AttachmentID },
		Progress: func(s, _ int64) {
			if s > cliPart+10 {
				stop()
			}
		},
	})
	if err == nil || id == 0 {
		t.Fatalf("the cut upload: %v, id %d", err, id)
	}
	sum := sha256.Sum256(big)
	uploads := filepath.Join(keys, mustServerDir(t, srv.URL), "alice", uploadsDir)
	if err := os.MkdirAll(uploads, 0o700); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(uploadRecord{AttachmentID: id})
	if err := os.WriteFile(uploadRecordPath(uploads, conv, bigPath, hex.EncodeToString(sum[:])), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	cli.do("/file "+bigPath, "* resumed upload "+strconv.FormatUint(id, 10)+" of big.bin")
	waitOutput(t, cli.out, "alice: 📎 big.bin (")
	bev := bob.wait(t, "big.bin", func(ev client.Event) bool {
		return ev.Kind == client.EventMessage && ev.Message.AttachmentID == id
	})
	var got bytes.Buffer
	if _, _, err := bob.Download(ctx, conv, bev.Message.Seq, &got, client.DownloadOptions{}); err != nil || !bytes.Equal(got.Bytes(), big) {
		t.Fatalf("the resumed file: %d bytes, %v", got.Len(), err)
	}
	if left, _ := os.ReadDir(uploads); len(left) != 0 {
		t.Fatalf("upload records left after the send: %v", left)
	}
	cli.quit()
}

// startSDKDevice is startSDKUser on another device of user.
func startSDKDevice(t *testing.T, ctx context.Context, srv *servertest.Server, user, device string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: device})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	go func() {
		for range c.Events() {
		}
	}()
	t.Cleanup(func() { c.Close() })
	return c
}

func mustServerDir(t *testing.T, url string) string {
	d, err := serverDir(url)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestChatCLIE2EFile: in an E2E conversation /file encrypts before it
// uploads (the SDK peer decrypts it), an incoming E2E file prints with
// its sealed name, and /save decrypts it.
func TestChatCLIE2EFile(t *testing.T) {
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) { c.Attach.PartBytes = cliPart }))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bob, err := client.New(client.Config{URL: srv.URL, Token: srv.Token("bob"), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = bob.Run(ctx) }()
	defer bob.Close()
	st := e2ee.NewMemoryStore()
	bobDev, err := e2ee.OpenDevice(st, e2ee.Address{User: "bob", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	bm := e2eechat.New(bob, bobDev, st)
	if _, err := bm.PublishKeys(ctx, 5); err != nil {
		t.Fatal(err)
	}
	cli := startKeyedCLI(t, ctx, srv.URL, srv.Token("alice"), t.TempDir())
	waitOutput(t, cli.out, "connected")
	cli.do("/sdm bob", "end-to-end encrypted direct with bob")
	dir := t.TempDir()
	secret := bytes.Repeat([]byte("secret plans; "), 10000)
	path := filepath.Join(dir, "plans.txt")
	if err := os.WriteFile(path, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cli.do("/file "+path, "alice: 📎 plans.txt (137 KiB, text/plain)")

	var conv uint64
	for conv == 0 {
		select {
		case ev := <-bob.Events():
			if ev.Kind != client.EventMessage || ev.Message.Kind != protocol.KindFile {
				continue
			}
			o, err := bm.Open(*ev.Message)
			if err != nil || o.File == nil || o.File.Name != "plans.txt" {
				t.Fatalf("bob opened %+v, %v", o, err)
			}
			var got bytes.Buffer
			if err := bm.DownloadFile(ctx, ev.ConvID, ev.Message.Seq, o.File, &got, t.TempDir()); err != nil || !bytes.Equal(got.Bytes(), secret) {
				t.Fatalf("bob's decryption: %d bytes, %v", got.Len(), err)
			}
			conv = ev.ConvID
		case <-ctx.Done():
			t.Fatal("bob never got the file")
		}
	}
	pic := pngFile(t, 120, 90)
	ack, _, err := bm.SendFile(ctx, conv, bytes.NewReader(pic), int64(len(pic)), e2eechat.FileOptions{Name: "photo.png", MediaType: "image/png", Caption: "us"})
	if err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(ack.Seq, 10)
	waitOutput(t, cli.out, "bob: 📎 photo.png (")
	waitOutput(t, cli.out, "image/png 120×90) us")
	saveTo := filepath.Join(t.TempDir(), "mine.png")
	cli.do("/save "+seq+" "+saveTo, "* saved photo.png")
	if got, err := os.ReadFile(saveTo); err != nil || !bytes.Equal(got, pic) {
		t.Fatalf("saved picture: %d bytes, %v", len(got), err)
	}
	cli.quit()
}
