// Package attach is the attachment service of a chat process: the upload
// frames (upload_create, upload_status, upload_part, upload_complete),
// Parley's own upload and download endpoints on the embedded default, the
// message side of a file (Attach, Stored, Recalled, attachment_url), the
// garbage collection of expired and deleted files and the thumbnail
// worker. Records live in the store (store.Attachments), bytes in the blob
// seam (internal/blob): the file under f/<attachment_id>, its thumbnail
// under t/<attachment_id>.
//
// The service keeps no state between requests that another chat process
// would need: every decision reads the record, every change is a
// compare-and-set on it, so any chat process serves any upload. What it
// keeps in memory only guards work in progress in this process (the part
// being received per upload, the thumbnails queued).
//
// Service methods are safe for concurrent use. Run owns the service's
// goroutines (the GC loop and the thumbnail workers) and returns once they
// have ended.
package attach

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// IDs mints attachment ids (the chat service's Snowflake generator, so
// that attachment and message ids never collide).
type IDs interface{ Next() uint64 }

// KeyFile is the file under the data directory that holds the key of
// Parley's signed URLs.
const KeyFile = "attach.key"

// KeyBytes is the size of that key.
const KeyBytes = 32

// Service is the attachment service of one chat process.
type Service struct {
	cfg Config
	st  store.Store
	att store.Attachments
	bs  blob.Store
	// pre is set when the blob engine can be reached by clients directly
	// (S3): parts go to presigned URLs. Nil: Parley's own endpoints.
	pre blob.Presigner
	ids IDs
	log *slog.Logger
	now func() time.Time

	thumbs chan uint64 // thumbnails to make (thumbs.go)

	// mu guards the work in progress in this process.
	mu struct {
		sync.Mutex
		// receiving: uploads whose part this process is receiving
		// (http_upload.go), one part at a time per upload.
		receiving map[uint64]bool
		// queued: thumbnails queued or being made (thumbs.go).
		queued map[uint64]bool
		// readBacks: S3 completions being finished, or finished a
		// short while ago (upload.go).
		readBacks map[uint64]*readBack
	}
}

// New returns the service on st's records and bs's bytes. It starts no
// goroutine (Run does). now is the clock of expiries and URLs (nil:
// time.Now).
func New(cfg Config, st store.Store, bs blob.Store, ids IDs, log *slog.Logger, now func() time.Time) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, errors.New("attach: attachments are off (attach.max_file_bytes 0)")
	}
	if st == nil || bs == nil || ids == nil {
		return nil, errors.New("attach: store, blob store and ids are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	s := &Service{cfg: cfg, st: st, att: st, bs: bs, ids: ids, log: log, now: now, thumbs: make(chan uint64, thumbQueue)}
	if p, ok := bs.(blob.Presigner); ok {
		s.pre = p
	} else if len(cfg.Key) != KeyBytes {
		return nil, fmt.Errorf("attach: the URL key must be %d bytes, got %d", KeyBytes, len(cfg.Key))
	}
	s.mu.receiving = map[uint64]bool{}
	s.mu.queued = map[uint64]bool{}
	s.mu.readBacks = map[uint64]*readBack{}
	return s, nil
}

// Config is the service's configuration.
func (s *Service) Config() Config { return s.cfg }

// Target is where upload_part's URLs point: protocol.TargetS3 on an
// engine clients reach directly, else protocol.TargetParley (the node's
// own PUT endpoint, UploadHandler).
func (s *Service) Target() string {
	if s.pre != nil {
		return protocol.TargetS3
	}
	return protocol.TargetParley
}

// Handle runs one attachment frame of c (validated by protocol.DecodeClient)
// and returns its answer (the caller sets the rid) or the error to send.
func (s *Service) Handle(ctx context.Context, c protocol.Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if c.Admin {
		return nil, protocol.Errorf(protocol.CodeForbidden, "the server API does not upload")
	}
	switch f.Type {
	case protocol.TypeUploadCreate:
		return s.uploadCreate(ctx, c, f)
	case protocol.TypeUploadStatus:
		return s.uploadStatus(ctx, c, f)
	case protocol.TypeUploadPart:
		return s.uploadPart(ctx, c, f)
	case protocol.TypeUploadComplete:
		return s.uploadComplete(ctx, c, f)
	case protocol.TypeAttachmentURL:
		return s.attachmentURL(ctx, c, f)
	}
	return nil, protocol.Errorf(protocol.CodeUnknownType, "unknown frame type %q", f.Type)
}

// Run runs the GC loop and the thumbnail worker until ctx ends.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range thumbWorkers {
		wg.Add(1)
		go func() { defer wg.Done(); s.thumbWorker(ctx) }()
	}
	s.gcLoop(ctx)
	wg.Wait()
}

// FileKey and ThumbKey are the blob keys of attachment id's file and
// thumbnail.
func FileKey(id uint64) string  { return "f/" + strconv.FormatUint(id, 10) }
func ThumbKey(id uint64) string { return "t/" + strconv.FormatUint(id, 10) }

// sign is the signature of a Parley URL over msg (its fields, one per
// line): base64url of HMAC-SHA256 under the URL key.
func (s *Service) sign(msg string) string {
	m := hmac.New(sha256.New, s.cfg.Key)
	m.Write([]byte(msg))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// signed reports whether sig is msg's signature.
func (s *Service) signed(msg, sig string) bool {
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return false
	}
	m := hmac.New(sha256.New, s.cfg.Key)
	m.Write([]byte(msg))
	return hmac.Equal(got, m.Sum(nil))
}

// storeErr turns a store failure into the client-facing error.
func (s *Service) storeErr(op string, err error) *protocol.Error {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.Is(err, store.ErrNotMember):
		return protocol.Errorf(protocol.CodeNotMember, "not a member of this conversation")
	case errors.Is(err, store.ErrNotFound):
		return protocol.Errorf(protocol.CodeNotFound, "not found")
	case errors.Is(err, store.ErrQuota):
		return protocol.Errorf(protocol.CodeQuotaExceeded, "the file would take your stored files over %d bytes", s.cfg.UserQuotaBytes)
	case errors.Is(err, store.ErrInflight):
		return protocol.Errorf(protocol.CodeTooManyUploads, "you have %d uploads not completed; complete or let them expire first", s.cfg.UploadsInFlight)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return protocol.Errorf(protocol.CodeStoreUnavailable, "%s: timed out", op)
	}
	s.log.Error("attachment store failed", "op", op, "err", err)
	return protocol.Errorf(protocol.CodeStoreUnavailable, "%s failed; retry", op)
}

// blobErr turns a blob engine failure into the client-facing error.
func (s *Service) blobErr(op string, err error) *protocol.Error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return protocol.Errorf(protocol.CodeStoreUnavailable, "%s: timed out", op)
	}
	s.log.Error("blob store failed", "op", op, "err", err)
	return protocol.Errorf(protocol.CodeStoreUnavailable, "%s failed; retry", op)
}

// LoadOrCreateKey returns the URL key in dir/KeyFile, creating it (32
// random bytes, mode 0600) on first use. Two processes starting together
// on a fresh dir both end up with the key linked into place first.
func LoadOrCreateKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, KeyFile)
	key, err := readKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("attach: create key: %w", err)
	}
	key = make([]byte, KeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("attach: create key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, KeyFile+".tmp*") // 0600
	if err != nil {
		return nil, fmt.Errorf("attach: create key: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(key)
	if err := errors.Join(werr, tmp.Sync(), tmp.Close()); err != nil {
		return nil, fmt.Errorf("attach: create key: %w", err)
	}
	// Link, unlike rename, fails when the target exists: a key another
	// process already signs with is never replaced.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("attach: create key: %w", err)
	}
	return readKey(path)
}

func readKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("attach: read key: %w", err)
	}
	if len(key) != KeyBytes {
		return nil, fmt.Errorf("attach: key %s is %d bytes, want %d", path, len(key), KeyBytes)
	}
	return key, nil
}
