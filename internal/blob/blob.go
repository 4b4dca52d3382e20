// Package blob is the seam of attachment bytes: objects written whole
// (Put, with their size and SHA-256 checked while writing) or in parts
// (Create, PutPart, Parts, Complete, Abort — S3's multipart upload), read
// back whole or by byte range, deleted. Engines: blob/disk (files under
// the data directory, the embedded default) and blob/s3 (any S3-compatible
// server); each passes the conformance suite in blob/blobtest. Engines
// whose clients can reach them directly also implement Presigner, so the
// bytes of an upload or download never pass through Parley's processes.
//
// Keys are 1–200 bytes of [A-Za-z0-9._/-] in segments separated by "/",
// none of them empty, "." or containing "..", so that every engine can use
// them as they are (S3 servers that keep objects in a file tree, like
// SeaweedFS, refuse or merge "a//b", "a/./b" and "a/"). Stores are safe
// for concurrent use.
package blob

import (
	"context"
	"errors"
	"io"
	"time"
)

// Sentinel errors. Engines wrap engine failures as "blob/<engine>: op: %w"
// and these with %w, so callers test them with errors.Is.
var (
	ErrNotFound = errors.New("blob: not found")
	// ErrSize: the reader held more or fewer bytes than declared (Put,
	// PutPart); nothing was stored.
	ErrSize = errors.New("blob: size mismatch")
	// ErrHash: the bytes' SHA-256 is not the declared one (Put); nothing
	// was stored.
	ErrHash = errors.New("blob: hash mismatch")
	// ErrBadKey: the key is not a valid key (see the package comment).
	ErrBadKey = errors.New("blob: invalid key")
	// ErrBadParts: Complete was given parts that are not the upload's
	// (missing, out of order, a size that does not match, a part other
	// than the last smaller than MinPartSize).
	ErrBadParts = errors.New("blob: invalid parts")
	ErrClosed   = errors.New("blob: closed")
)

// MinPartSize is the smallest size of a part other than the last (S3's
// limit); the conformance suite uses it.
const MinPartSize = 5 << 20

// MaxParts is the most parts one upload has (S3's limit).
const MaxParts = 10000

// Info describes a stored object.
type Info struct {
	Size int64
}

// Part is one part of a multipart upload as the engine holds it.
type Part struct {
	N    int // from 1
	Size int64
	ETag string // engine's tag; passed back to Complete as received
}

// Store is the blob seam.
type Store interface {
	// Put stores exactly size bytes from r under key, replacing an
	// existing object only once the new one is whole. A reader with more
	// or fewer bytes gives ErrSize, a SHA-256 other than sum ErrHash; then
	// nothing under key changed.
	Put(ctx context.Context, key string, r io.Reader, size int64, sum [32]byte) error
	// Open reads the bytes [off, off+n) of key (n < 0: to the end); off
	// beyond the size reads nothing. Info is the whole object's.
	Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, Info, error)
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key; an absent key is no error.
	Delete(ctx context.Context, key string) error

	// Create starts a multipart upload of key and returns its id. The
	// object appears only at Complete.
	Create(ctx context.Context, key string) (upload string, err error)
	// PutPart stores part n (1..MaxParts) of size bytes from r, replacing
	// an earlier part n; ErrSize when r holds more or fewer.
	PutPart(ctx context.Context, key, upload string, n int, r io.Reader, size int64) (Part, error)
	// Parts lists the parts received, by number. ErrNotFound: no such
	// upload (never created, completed or aborted).
	Parts(ctx context.Context, key, upload string) ([]Part, error)
	// Complete joins parts (as Parts returned them, 1..k in order) into
	// the object key, then forgets the upload.
	Complete(ctx context.Context, key, upload string, parts []Part) error
	// Abort forgets the upload and its parts; an unknown one is no error.
	Abort(ctx context.Context, key, upload string) error

	Close() error
}

// GetOptions are the response headers a presigned download asks for.
type GetOptions struct {
	ContentType        string
	ContentDisposition string
}

// Presigner is implemented by engines a client can reach directly: URLs
// that let the holder, without any other credential, PUT one part or GET
// one object until ttl passes.
type Presigner interface {
	PresignPart(ctx context.Context, key, upload string, n int, ttl time.Duration) (string, error)
	PresignGet(ctx context.Context, key string, ttl time.Duration, o GetOptions) (string, error)
}

// ValidKey reports whether key is a valid key (see the package comment).
func ValidKey(key string) bool {
	if len(key) == 0 || len(key) > 200 {
		return false
	}
	seg := 0 // length of the segment so far
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		case c == '.':
			if i+1 < len(key) && key[i+1] == '.' {
				return false
			}
		case c == '/':
			if seg == 0 || (seg == 1 && key[i-1] == '.') {
				return false
			}
			seg = 0
			continue
		default:
			return false
		}
		seg++
	}
	return seg > 0 && !(seg == 1 && key[len(key)-1] == '.')
}
