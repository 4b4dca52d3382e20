package e2eechat

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/protocol"
)

// Files of E2E conversations: the sender encrypts the file with a fresh
// key (e2ee.EncryptAttachment) to a temporary file, uploads that
// ciphertext (media type application/octet-stream, name "encrypted": the
// server learns neither the name nor the type, and the size only to
// within a padding bucket), and sends a message of kind file whose
// encrypted content carries the File: name, type, real size, key,
// digest, and a thumbnail made here. The receiver downloads the
// ciphertext and decrypts it only after its digest and MAC verify
// (DownloadFile).

// Names the server sees of every E2E upload.
const (
	EncryptedMediaType = "application/octet-stream"
	EncryptedName      = "encrypted"
)

// File is the file of an E2E file message, sealed inside its content.
type File struct {
	AttachmentID uint64 `json:"attachment_id,string"`
	Name         string `json:"name"`
	MediaType    string `json:"media_type"`
	Size         int64  `json:"size"`   // of the plaintext
	Key          []byte `json:"key"`    // e2ee.AttachmentKeySize bytes (base64 in JSON)
	Digest       string `json:"digest"` // SHA-256 of the ciphertext, hex
	Width        int    `json:"width,omitempty"`
	Height       int    `json:"height,omitempty"`
	DurationMS   int64  `json:"duration_ms,omitempty"`
	Caption      string `json:"caption,omitempty"`
	// Thumbnail is a JPEG of at most MaxThumbnailBytes (images only).
	Thumbnail []byte `json:"thumbnail,omitempty"`
}

func (f *File) valid() error {
	switch {
	case f == nil:
		return errors.New("e2eechat: file content without a file")
	case len(f.Key) != e2ee.AttachmentKeySize:
		return fmt.Errorf("e2eechat: file key of %d bytes", len(f.Key))
	case len(f.Digest) != 2*e2ee.AttachmentDigestSize || strings.ToLower(f.Digest) != f.Digest:
		return fmt.Errorf("e2eechat: file digest %.80q", f.Digest)
	case f.Size < 0:
		return fmt.Errorf("e2eechat: file size %d", f.Size)
	case len(f.Thumbnail) > MaxThumbnailBytes:
		return fmt.Errorf("e2eechat: thumbnail of %d bytes", len(f.Thumbnail))
	}
	if _, err := hex.DecodeString(f.Digest); err != nil {
		return fmt.Errorf("e2eechat: file digest: %w", err)
	}
	return nil
}

// FileOptions describe a file SendFile sends.
type FileOptions struct {
	Name       string // shown to the receivers, never to the server
	MediaType  string // likewise; "" is application/octet-stream
	Caption    string
	DurationMS int64 // of a voice note or video
	// Width and Height of a video; an image's are read from it.
	Width, Height int
	// Progress reports the upload of the ciphertext (client.UploadOptions).
	Progress func(sent, total int64)
	// TempDir holds the ciphertext while it is uploaded ("" is
	// os.TempDir()): a file of the ciphertext's size, 0600, removed once
	// the message is sent. An interrupted send leaves it there with a
	// record in the device's Store, and SendFile of the same file to the
	// same conversation resumes that upload instead of starting over.
	TempDir string
}

// pendingFile is the record of an E2E upload not yet named by a message,
// kept under pendingKey so that SendFile of the same plaintext resumes it.
type pendingFile struct {
	AttachmentID uint64 `json:"attachment_id,string,omitempty"`
	Key          []byte `json:"key"`
	Digest       string `json:"digest"`
	Path         string `json:"path"`
	Size         int64  `json:"size"` // of the ciphertext
}

func pendingKey(conv uint64, plainSHA string) string {
	return "fileup/" + groupName(conv) + "/" + plainSHA
}

// SendFile encrypts size bytes of r (read up to three times: hash,
// thumbnail, encryption), uploads the ciphertext to E2E conversation
// convID and sends a message of kind file carrying the File (read like
// Send: the conversation's kind and members from the server). It returns
// the ack and the File as sealed. An interrupted SendFile is resumed by
// calling it again with the same file and conversation (see
// FileOptions.TempDir).
func (m *Messenger) SendFile(ctx context.Context, convID uint64, r io.ReaderAt, size int64, opts FileOptions) (client.Ack, *File, error) {
	peer, members, err := m.route(ctx, convID)
	if err != nil {
		return client.Ack{}, nil, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(r, 0, size)); err != nil {
		return client.Ack{}, nil, fmt.Errorf("e2eechat: file: %w", err)
	}
	pkey := pendingKey(convID, hex.EncodeToString(h.Sum(nil)))
	up, err := m.uploadEncrypted(ctx, convID, pkey, r, size, opts)
	if err != nil {
		return client.Ack{}, nil, err
	}
	f := &File{
		AttachmentID: up.AttachmentID, Name: opts.Name, MediaType: opts.MediaType, Size: size,
		Key: up.Key, Digest: up.Digest, DurationMS: opts.DurationMS, Caption: opts.Caption,
		Width: opts.Width, Height: opts.Height,
	}
	if f.MediaType == "" {
		f.MediaType = EncryptedMediaType
	}
	var thumbnail func(budget int) []byte
	if strings.HasPrefix(f.MediaType, "image/") {
		if w, h, err := ImageSize(r, size); err == nil {
			f.Width, f.Height = w, h
		}
		thumbnail = func(budget int) []byte {
			if budget <= 0 {
				return nil
			}
			jpg, err := Thumbnail(r, size, budget)
			if err != nil {
				return nil
			}
			return jpg
		}
	}
	fr := protocol.Frame{Type: protocol.TypeSend, ConvID: convID, Kind: protocol.KindFile, AttachmentID: f.AttachmentID}
	var c content
	if peer != "" {
		fr.Body, c, err = m.sealDirectFile(ctx, convID, peer, f, thumbnail)
	} else {
		fr.Body, c, err = m.sealGroupFile(ctx, convID, members, f, thumbnail)
	}
	if err != nil {
		return client.Ack{}, nil, err
	}
	ack, err := m.sendOwn(ctx, fr, c)
	if err != nil {
		return ack, nil, err
	}
	os.Remove(up.Path)
	return ack, c.File, m.st.Delete(pkey)
}

// maxBody is the server's max_body_bytes.
func (m *Messenger) maxBody() int {
	if h, ok := m.c.Hello(); ok && h.Limits.MaxBodyBytes > 0 {
		return h.Limits.MaxBodyBytes
	}
	return protocol.DefaultLimits.MaxBodyBytes
}

// thumbBudget is the thumbnail size that lets a content sealed to n
// envelopes fit max_body_bytes: each envelope holds the content (the
// thumbnail in base64 in JSON) in a ciphertext that is itself base64,
// plus up to about 2.5 KB of protocol (a first message's PQXDH header
// and KEM ciphertext, the content's other fields).
func thumbBudget(maxBody, n int) int {
	per := maxBody/max(n, 1)*3/4 - 2560
	return min(MaxThumbnailBytes, per*3/4)
}

func (m *Messenger) sealDirectFile(ctx context.Context, conv uint64, peer string, f *File, thumbnail func(int) []byte) (string, content, error) {
	to, err := m.targets(ctx, []string{peer, m.self.User}, true)
	if err != nil {
		return "", content{}, err
	}
	if len(to) == 0 {
		return "", content{}, fmt.Errorf("e2eechat: %s has no device with keys", peer)
	}
	if thumbnail != nil {
		f.Thumbnail = thumbnail(thumbBudget(m.maxBody(), len(to)))
	}
	for {
		c, err := m.bind(conv, protocol.KindFile, 0, content{T: "file", File: f})
		if err != nil {
			return "", c, err
		}
		env, err := m.seal(ctx, to, c)
		if err != nil {
			return "", c, err
		}
		body := protocol.EncodeEnvelope(protocol.Envelope{To: env})
		if len(body) <= m.maxBody() || f.Thumbnail == nil {
			return body, c, nil
		}
		f.Thumbnail = nil // the estimate was short: the file goes without
	}
}

func (m *Messenger) sealGroupFile(ctx context.Context, conv uint64, members []string, f *File, thumbnail func(int) []byte) (string, content, error) {
	if thumbnail != nil {
		f.Thumbnail = thumbnail(thumbBudget(m.maxBody(), 1))
	}
	for {
		body, c, err := m.groupEnvelope(ctx, conv, members, protocol.KindFile, 0, content{T: "file", File: f})
		if err != nil || len(body) <= m.maxBody() || f.Thumbnail == nil {
			return body, c, err
		}
		f.Thumbnail = nil
	}
}

// uploadEncrypted uploads the encryption of r, resuming the upload of
// the record under pkey when its ciphertext is still there.
func (m *Messenger) uploadEncrypted(ctx context.Context, conv uint64, pkey string, r io.ReaderAt, size int64, opts FileOptions) (pendingFile, error) {
	var rec pendingFile
	if b, err := m.st.Load(pkey); err != nil {
		return rec, err
	} else if b != nil && json.Unmarshal(b, &rec) == nil && rec.AttachmentID != 0 {
		if ct, err := os.Open(rec.Path); err == nil {
			st, serr := ct.Stat()
			if serr == nil && st.Size() == rec.Size {
				info, err := m.c.ResumeUpload(ctx, rec.AttachmentID, ct, client.UploadOptions{SHA256: rec.Digest, Progress: opts.Progress})
				ct.Close()
				switch {
				case err == nil && info.State != protocol.UploadUploading:
					return rec, nil
				case err != nil && client.CodeOf(err) != protocol.CodeNotFound && !errors.Is(err, client.ErrFileChanged):
					return rec, err // kept for the next attempt
				}
				// Expired or deleted meanwhile: start over.
			} else {
				ct.Close()
			}
		}
		os.Remove(rec.Path)
	}
	ct, err := os.CreateTemp(opts.TempDir, "parley-e2e-*.bin")
	if err != nil {
		return rec, fmt.Errorf("e2eechat: file: %w", err)
	}
	defer ct.Close()
	key := e2ee.NewAttachmentKey()
	digest, err := e2ee.EncryptAttachment(ct, io.NewSectionReader(r, 0, size), size, key)
	if err == nil {
		err = ct.Sync()
	}
	if err != nil {
		os.Remove(ct.Name())
		return rec, fmt.Errorf("e2eechat: encrypt file: %w", err)
	}
	rec = pendingFile{Key: key, Digest: hex.EncodeToString(digest), Path: ct.Name(), Size: e2ee.EncryptedSize(size)}
	save := func() error {
		b, _ := json.Marshal(rec)
		return m.st.Save(pkey, b)
	}
	var saveErr error
	info, err := m.c.Upload(ctx, conv, ct, rec.Size, client.UploadOptions{
		Name: EncryptedName, MediaType: EncryptedMediaType, SHA256: rec.Digest, Progress: opts.Progress,
		OnCreate: func(u protocol.UploadInfo) { rec.AttachmentID = u.AttachmentID; saveErr = save() },
	})
	if err == nil {
		err = saveErr
	}
	if err != nil {
		if rec.AttachmentID == 0 {
			os.Remove(ct.Name())
		}
		return rec, err
	}
	rec.AttachmentID = info.AttachmentID
	return rec, nil
}

// DownloadFile fetches the ciphertext of file message seq of convID
// (whose File Open returned) into a temporary file in tmpDir ("" is
// os.TempDir()), checks its digest and MAC, and only then writes the
// plaintext to w. A ciphertext that fails a check writes nothing
// (e2ee.ErrAttachmentDigest, e2ee.ErrAttachmentMAC).
func (m *Messenger) DownloadFile(ctx context.Context, convID, seq uint64, f *File, w io.Writer, tmpDir string) error {
	if err := f.valid(); err != nil {
		return err
	}
	digest, _ := hex.DecodeString(f.Digest)
	tmp, err := os.CreateTemp(tmpDir, "parley-e2e-*.bin")
	if err != nil {
		return fmt.Errorf("e2eechat: download: %w", err)
	}
	defer func() { tmp.Close(); os.Remove(tmp.Name()) }()
	// The digest pins the size too: a longer file cannot match it.
	limit := &limitWriter{w: tmp, left: e2ee.EncryptedSize(f.Size)}
	_, n, err := m.c.Download(ctx, convID, seq, limit, client.DownloadOptions{})
	if err != nil {
		return err
	}
	return e2ee.DecryptAttachment(w, tmp, n, f.Key, digest, f.Size)
}

// limitWriter refuses more than left bytes: a server that sends an
// endless file fills no disk.
type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, fmt.Errorf("e2eechat: download: %w: more bytes than the file's encryption has", e2ee.ErrAttachmentDigest)
	}
	l.left -= int64(len(p))
	return l.w.Write(p)
}
