package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2eechat"
	"github.com/parley-im/parley/protocol"
)

// Files in `parley-chat`: /file PATH uploads a file to the current
// conversation (encrypted first in an E2E one) and sends it; /save SEQ
// [PATH] downloads the file of message SEQ (decrypting it in an E2E
// conversation after checking its digest and MAC). An interrupted /file
// (a lost connection, the program stopped) resumes from the last part
// the server has when /file is run again with the same path in the same
// conversation: the upload is remembered under -keys DIR/<server>/<user>/
// +uploads by conversation, path and the file's SHA-256, and forgotten
// once the message is sent. With -keys "" nothing is remembered and an
// interrupted /file starts over.

// fileCommandTimeout bounds /file and /save, which move whole files.
const fileCommandTimeout = time.Hour

// uploadsDir holds the records of unfinished uploads (and, for E2E
// conversations, their ciphertexts), next to the account key.
const uploadsDir = "+uploads"

func (s *chatSession) uploadsDir() (string, error) {
	if s.e2e.dir == "" {
		return "", nil
	}
	me := s.user()
	if me == "" {
		return "", errors.New("not connected yet")
	}
	dir := filepath.Join(s.e2e.dir, s.e2e.server, me, uploadsDir)
	return dir, os.MkdirAll(dir, 0o700)
}

// mediaType guesses a file's type from its name, else from its first
// bytes.
func mediaType(path string, f io.ReaderAt) string {
	if t := mime.TypeByExtension(strings.ToLower(filepath.Ext(path))); t != "" {
		if mt, _, err := mime.ParseMediaType(t); err == nil {
			return mt
		}
	}
	head := make([]byte, 512)
	n, _ := f.ReadAt(head, 0)
	mt, _, _ := mime.ParseMediaType(http.DetectContentType(head[:n]))
	return mt
}

// fileName is the name a file is declared with: its base name, cut to
// the protocol's 255 bytes.
func fileName(path string) string {
	name := filepath.Base(path)
	for len(name) > 255 {
		_, size := lastRune(name)
		name = name[:len(name)-size]
	}
	return name
}

func lastRune(s string) (rune, int) {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i]&0xC0 != 0x80 {
			return rune(s[i]), len(s) - i
		}
	}
	return 0, 1
}

// progress prints "up 37% 3.1/8.4 MiB" on a terminal, at most every
// 200 ms and at the end; on a pipe it prints nothing.
type progress struct {
	s     *chatSession
	verb  string
	mu    sync.Mutex
	last  time.Time
	shown bool
}

func (p *progress) report(sent, total int64) {
	if !p.s.prompt {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if sent < total && time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last, p.shown = time.Now(), true
	pct := int64(100)
	if total > 0 {
		pct = sent * 100 / total
	}
	p.s.mu.Lock()
	fmt.Fprintf(p.s.out, "\r%s %d%% %s/%s ", p.verb, pct, mib(sent), humanSize(total))
	p.s.mu.Unlock()
}

func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		p.s.mu.Lock()
		fmt.Fprintln(p.s.out)
		p.s.mu.Unlock()
	}
}

func mib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) }

// humanSize is a size for people: "512 B", "12 KiB", "8.4 MiB".
func humanSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%d KiB", (n+1<<9)>>10)
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// fileLine describes a file message: "📎 cat.jpg (12 KiB, image/jpeg
// 800×600)", and its caption.
func fileLine(b protocol.FileBody) string {
	line := fmt.Sprintf("📎 %s (%s, %s", b.Name, humanSize(b.Size), b.MediaType)
	if b.Width > 0 && b.Height > 0 {
		line += fmt.Sprintf(" %d×%d", b.Width, b.Height)
	}
	if b.DurationMS > 0 {
		line += fmt.Sprintf(" %s", (time.Duration(b.DurationMS) * time.Millisecond).Round(time.Second))
	}
	line += ")"
	if b.Caption != "" {
		line += " " + b.Caption
	}
	return line
}

// uploadRecord is what /file remembers of an upload not yet sent.
type uploadRecord struct {
	AttachmentID uint64 `json:"attachment_id,string"`
}

func (s *chatSession) chatFile(ctx context.Context, args []string) error {
	path := args[0]
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("file: %s is not a regular file", path)
	}
	size, name, mt := st.Size(), fileName(path), mediaType(path, f)
	dir, err := s.uploadsDir()
	if err != nil {
		return fmt.Errorf("file: %w", err)
	}
	p := &progress{s: s, verb: "up"}
	defer p.done()
	conv := s.current
	if m, ok, err := s.e2eMessenger(ctx, conv); err != nil {
		return fmt.Errorf("file: %w", err)
	} else if ok {
		ack, sent, err := m.SendFile(ctx, conv, f, size, e2eechat.FileOptions{Name: name, MediaType: mt, Progress: p.report, TempDir: dir})
		if err != nil {
			return fmt.Errorf("file: %w", err)
		}
		p.done()
		p.shown = false
		s.printOnce(&protocol.Message{ConvID: conv, Seq: ack.Seq, Sender: s.user(), Kind: protocol.KindFile, Body: e2eFileJSON(sent)})
		return nil
	}
	info, err := s.uploadPlain(ctx, conv, path, f, size, name, mt, dir, p.report)
	if err != nil {
		return fmt.Errorf("file: %w", err)
	}
	var fm client.FileMessage
	if info.Width == 0 && strings.HasPrefix(mt, "image/") {
		// The server keeps these only when it read none itself.
		fm.Width, fm.Height, _ = e2eechat.ImageSize(f, size)
	}
	ack, err := s.c.SendFile(ctx, conv, info.AttachmentID, fm)
	if err != nil {
		return fmt.Errorf("file: %w (the upload is kept: /file %s again sends it)", err, path)
	}
	s.forgetUpload(dir, conv, path, info.SHA256)
	p.done()
	p.shown = false
	body := protocol.FileBody{AttachmentID: info.AttachmentID, Name: name, Size: size, MediaType: mt, Width: max(info.Width, fm.Width), Height: max(info.Height, fm.Height)}
	s.printOnce(&protocol.Message{ConvID: conv, Seq: ack.Seq, Sender: s.user(), Kind: protocol.KindFile, Body: fileJSON(body)})
	return nil
}

// e2eFileJSON is the FileBody an E2E file's sealed description reads
// as, for chatFormat.
func e2eFileJSON(f *e2eechat.File) string {
	return fileJSON(protocol.FileBody{AttachmentID: f.AttachmentID, Name: f.Name, Size: f.Size, MediaType: f.MediaType,
		Width: f.Width, Height: f.Height, DurationMS: f.DurationMS, Caption: f.Caption})
}

func fileJSON(b protocol.FileBody) string {
	out, _ := json.Marshal(b)
	return string(out)
}

// uploadRecordPath is where the upload of path (with SHA-256 sum) to
// conv is remembered.
func uploadRecordPath(dir string, conv uint64, path, sum string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	h := sha256.Sum256([]byte(strconv.FormatUint(conv, 10) + "\n" + abs + "\n" + sum))
	return filepath.Join(dir, hex.EncodeToString(h[:16])+".json")
}

func (s *chatSession) forgetUpload(dir string, conv uint64, path, sum string) {
	if dir != "" {
		os.Remove(uploadRecordPath(dir, conv, path, sum))
	}
}

// uploadPlain uploads f to plain conversation conv, resuming the upload
// remembered for the same path and content.
func (s *chatSession) uploadPlain(ctx context.Context, conv uint64, path string, f *os.File, size int64, name, mt, dir string, report func(int64, int64)) (protocol.UploadInfo, error) {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, size)); err != nil {
		return protocol.UploadInfo{}, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	opts := client.UploadOptions{Name: name, MediaType: mt, SHA256: sum, Progress: report}
	if dir == "" {
		return s.c.Upload(ctx, conv, f, size, opts)
	}
	rec := uploadRecordPath(dir, conv, path, sum)
	if b, err := os.ReadFile(rec); err == nil {
		var r uploadRecord
		if json.Unmarshal(b, &r) == nil && r.AttachmentID != 0 {
			info, err := s.c.ResumeUpload(ctx, r.AttachmentID, f, opts)
			switch {
			case err == nil && info.State == protocol.UploadAttached:
				// Sent before, and the record outlived it: a new upload.
			case err == nil:
				s.printf("* resumed upload %d of %s", r.AttachmentID, name)
				return info, nil
			case client.CodeOf(err) != protocol.CodeNotFound && !errors.Is(err, client.ErrFileChanged):
				return info, err
			}
		}
		os.Remove(rec)
	}
	var saveErr error
	opts.OnCreate = func(u protocol.UploadInfo) {
		b, _ := json.Marshal(uploadRecord{AttachmentID: u.AttachmentID})
		saveErr = writeSecret(rec, b)
	}
	info, err := s.c.Upload(ctx, conv, f, size, opts)
	if err == nil && saveErr != nil {
		s.printf("! file: the upload could not be remembered for a resume: %v", saveErr)
	}
	return info, err
}

func (s *chatSession) chatSave(ctx context.Context, args []string) error {
	seq, err := parseSeq("save", args[0])
	if err != nil {
		return err
	}
	conv := s.current
	after := seq - 1
	msgs, _, err := s.c.History(ctx, conv, client.HistoryQuery{AfterSeq: after, Forward: true, Limit: 1})
	if err != nil {
		return fmt.Errorf("save: %w", err)
	}
	if len(msgs) == 0 || msgs[0].Seq != seq {
		return fmt.Errorf("save: conv %d has no message %d", conv, seq)
	}
	msg := msgs[0]
	if msg.Kind != protocol.KindFile || msg.Recalled {
		return fmt.Errorf("save: message %d is not a file", seq)
	}
	var (
		name string
		file *e2eechat.File
		m    *e2eechat.Messenger
	)
	if mm, ok, err := s.e2eMessenger(ctx, conv); err != nil {
		return fmt.Errorf("save: %w", err)
	} else if ok {
		o, err := mm.Open(msg)
		if err != nil {
			return fmt.Errorf("save: %w", err)
		}
		if o.File == nil {
			return fmt.Errorf("save: message %d carries no file", seq)
		}
		m, file, name = mm, o.File, o.File.Name
	} else {
		b, err := client.ParseFileBody(msg)
		if err != nil {
			return fmt.Errorf("save: %w", err)
		}
		name = b.Name
	}
	dest := filepath.Base(name)
	if dest == "." || dest == "/" || dest == ".." || dest == "" {
		dest = fmt.Sprintf("file-%d-%d", conv, seq)
	}
	if len(args) > 1 {
		dest = args[1]
		if st, err := os.Stat(dest); err == nil && st.IsDir() {
			dest = filepath.Join(dest, filepath.Base(name))
		}
	}
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("save: %s exists (give another PATH)", dest)
	}
	// Written to a temporary name beside dest and renamed once whole, so
	// a failed download leaves nothing at dest.
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".parley-save-*")
	if err != nil {
		return fmt.Errorf("save: %w", err)
	}
	defer func() { tmp.Close(); os.Remove(tmp.Name()) }()
	var n int64
	if file != nil {
		err = m.DownloadFile(ctx, conv, seq, file, tmp, filepath.Dir(dest))
		n = file.Size
	} else {
		_, n, err = s.c.Download(ctx, conv, seq, tmp, client.DownloadOptions{})
	}
	if err == nil {
		err = tmp.Sync()
	}
	if err == nil {
		err = tmp.Close()
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err != nil {
		return fmt.Errorf("save: %w", err)
	}
	s.printf("* saved %s (%s) to %s", name, humanSize(n), dest)
	return nil
}
