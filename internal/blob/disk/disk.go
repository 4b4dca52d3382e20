// Package disk is the embedded blob engine: files under one directory
// (the server uses <data_dir>/blobs), nothing to configure.
//
// Layout, under the root:
//
//	LOCK                      held while a Store is open (one process per root)
//	objects/<hh>/<sha256>     an object, named by the SHA-256 of its key (hex;
//	                          hh its first byte), so no key is confused with a path
//	uploads/<id>/key          a multipart upload: the key it is for
//	uploads/<id>/data         the bytes of its parts, each appended where the
//	                          previous one ended
//	uploads/<id>/<nnnnn>      part n: a 16-byte random tag (the part's ETag), then
//	                          the offset and size of its bytes in data (8 bytes
//	                          each, big-endian)
//
// Every object and part descriptor is written under a temporary name
// (".tmp-*") in its final directory, fsynced, renamed into place and its
// directory fsynced, so a crash leaves each object and part whole or
// absent; a part's bytes are fsynced in data before its descriptor
// exists. An upload is created and removed by renaming its whole
// directory. Parts sent in order, none replaced (what Parley's clients
// do), lie in data end to end: Complete then renames data to the object,
// no byte copied; any other set of parts is copied into a new file in the
// kernel (copy_file_range). Open sweeps what a crash left behind
// (temporary files, half-removed uploads, an upload whose data already
// became its object). Bytes stream through a fixed buffer and are never
// held whole in memory. Files are 0600 and directories 0700 whatever the
// umask (as in internal/privatefs).
//
// A Store is safe for concurrent use. Within an upload, parts are written
// concurrently (each into its own range of data), and Complete and Abort
// wait for the parts being written; one process uses a root at a time
// (the LOCK), so these locks are in memory.
package disk

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gofrs/flock"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/privatefs"
)

const (
	tagSize   = 16 // bytes of a part's tag
	descSize  = tagSize + 16
	dataName  = "data"
	tmpPrefix = ".tmp-"
	deadMark  = ".dead-" // an upload directory being removed
	// bufSize is the buffer each write streams through: 100 uploads at
	// once hold 100 of them.
	bufSize = 64 << 10
)

// crashPoint, when set (by tests), is called between the steps of a write,
// so a test process can be killed exactly there.
var crashPoint func(step string)

func step(name string) {
	if crashPoint != nil {
		crashPoint(name)
	}
}

// Store is a blob.Store on a directory.
type Store struct {
	root    string
	objects string
	uploads string
	lock    *flock.Flock
	closed  atomic.Bool

	umu     sync.Mutex
	pending map[string]*upState // uploads some call is using, by id
}

// upState is what the calls using one upload share.
type upState struct {
	refs int // guarded by Store.umu
	// mu is held shared by PutPart and Parts, exclusively by Complete and
	// Abort.
	mu sync.RWMutex
	// amu guards end: the offset in data where the next part goes (-1
	// until the first PutPart reads the descriptors).
	amu sync.Mutex
	end int64
}

var _ blob.Store = (*Store)(nil)

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// Open opens (creating it if missing) the store under dir, locks it for
// this process and clears what an earlier process left half done.
func Open(dir string) (*Store, error) {
	s := &Store{root: dir, objects: filepath.Join(dir, "objects"), uploads: filepath.Join(dir, "uploads"), pending: map[string]*upState{}}
	if err := mkdir(dir); err != nil {
		return nil, err
	}
	s.lock = flock.New(filepath.Join(dir, "LOCK"))
	ok, err := s.lock.TryLock()
	if err != nil {
		return nil, fmt.Errorf("blob/disk: lock %s: %w", dir, err)
	}
	if !ok {
		return nil, fmt.Errorf("blob/disk: %s is in use by another process", dir)
	}
	if err := os.Chmod(filepath.Join(dir, "LOCK"), privatefs.FileMode); err != nil {
		_ = s.lock.Unlock()
		return nil, fmt.Errorf("blob/disk: %w", err)
	}
	if err := s.prepare(); err != nil {
		_ = s.lock.Unlock()
		return nil, err
	}
	return s, nil
}

// prepare makes the directories and removes leftovers of a crash.
func (s *Store) prepare() error {
	for _, d := range []string{s.objects, s.uploads} {
		if err := mkdir(d); err != nil {
			return err
		}
	}
	made := false
	for i := range 256 {
		shard := filepath.Join(s.objects, fmt.Sprintf("%02x", i))
		err := os.Mkdir(shard, privatefs.DirMode)
		switch {
		case err == nil:
			made = true
			if err := os.Chmod(shard, privatefs.DirMode); err != nil {
				return fmt.Errorf("blob/disk: %w", err)
			}
		case errors.Is(err, fs.ErrExist):
			if err := sweep(shard); err != nil {
				return err
			}
		default:
			return fmt.Errorf("blob/disk: %w", err)
		}
	}
	if made {
		if err := syncDir(s.objects); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(s.uploads)
	if err != nil {
		return fmt.Errorf("blob/disk: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		p := filepath.Join(s.uploads, name)
		switch {
		case strings.HasPrefix(name, tmpPrefix), strings.HasPrefix(name, deadMark):
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("blob/disk: %w", err)
			}
		case e.IsDir():
			if err := sweep(p); err != nil {
				return err
			}
			joined, err := joinedUpload(p)
			if err != nil {
				return err
			}
			if joined {
				// A crash between Complete's rename of data and the
				// removal of the upload: the object is whole.
				if err := s.remove(p, name); err != nil {
					return fmt.Errorf("blob/disk: %w", err)
				}
			}
		}
	}
	return nil
}

// joinedUpload reports whether the upload in dir has parts but no data:
// Complete renamed its data to the object.
func joinedUpload(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("blob/disk: %w", err)
	}
	parts := false
	for _, e := range entries {
		switch {
		case e.Name() == dataName:
			return false, nil
		case isPartName(e.Name()):
			parts = true
		}
	}
	return parts, nil
}

// sweep removes the temporary files of dir.
func sweep(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("blob/disk: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("blob/disk: %w", err)
			}
		}
	}
	return nil
}

// mkdir creates dir 0700 if it is missing; an existing directory keeps its
// mode (the data directory is the operator's).
func mkdir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, privatefs.DirMode); err != nil {
		return fmt.Errorf("blob/disk: %w", err)
	}
	if err := os.Chmod(dir, privatefs.DirMode); err != nil {
		return fmt.Errorf("blob/disk: %w", err)
	}
	return syncDir(filepath.Dir(dir))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("blob/disk: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("blob/disk: fsync %s: %w", dir, err)
	}
	return nil
}

// Close releases the directory; calls after it fail with ErrClosed.
// Reads already open go on.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.lock.Unlock()
}

func (s *Store) check(op, key string) error {
	if s.closed.Load() {
		return fmt.Errorf("blob/disk: %s: %w", op, blob.ErrClosed)
	}
	if !blob.ValidKey(key) {
		return fmt.Errorf("blob/disk: %s %q: %w", op, key, blob.ErrBadKey)
	}
	return nil
}

// path returns the file of key.
func (s *Store) path(key string) string {
	h := sha256.Sum256([]byte(key))
	name := hex.EncodeToString(h[:])
	return filepath.Join(s.objects, name[:2], name)
}

// tempFile creates a new private file with a temporary name in dir.
func tempFile(dir string) (*os.File, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	name := filepath.Join(dir, tmpPrefix+hex.EncodeToString(b[:]))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, privatefs.FileMode)
	if err != nil {
		return nil, err
	}
	// Explicit, so that a default ACL on the directory adds nothing.
	if err := f.Chmod(privatefs.FileMode); err != nil {
		f.Close()
		os.Remove(name)
		return nil, err
	}
	return f, nil
}

// copyExact copies exactly size bytes of r to w, hashing them into h when
// it is set; ErrSize if r holds more or fewer. It reads one byte beyond
// size to see that r ends there.
func copyExact(ctx context.Context, w io.Writer, r io.Reader, size int64, h hash.Hash) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	left := size
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		want := int64(len(buf))
		if left+1 < want {
			want = left + 1
		}
		n, err := r.Read(buf[:want])
		if int64(n) > left {
			return fmt.Errorf("%w: the reader holds more bytes than declared", blob.ErrSize)
		}
		if n > 0 {
			if h != nil {
				h.Write(buf[:n])
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			left -= int64(n)
		}
		if err == io.EOF {
			if left > 0 {
				return fmt.Errorf("%w: the reader ended %d bytes early", blob.ErrSize, left)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// commit makes the temporary file f durable under name: fsync, close,
// rename, fsync the directory. On failure f is removed.
func commit(f *os.File, name, crash string) (err error) {
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	step(crash + ".written")
	if err := os.Rename(f.Name(), name); err != nil {
		return err
	}
	step(crash + ".renamed")
	return syncDir(filepath.Dir(name))
}

// Put writes the object to a temporary file, checks it, then renames it
// over key.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64, sum [32]byte) error {
	if err := s.check("put", key); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("blob/disk: put %q: size %d: %w", key, size, blob.ErrSize)
	}
	name := s.path(key)
	f, err := tempFile(filepath.Dir(name))
	if err != nil {
		return fmt.Errorf("blob/disk: put %q: %w", key, err)
	}
	h := sha256.New()
	if err := copyExact(ctx, f, r, size, h); err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("blob/disk: put %q: %w", key, err)
	}
	var got [32]byte
	h.Sum(got[:0])
	if got != sum {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("blob/disk: put %q: %w", key, blob.ErrHash)
	}
	if err := commit(f, name, "put"); err != nil {
		return fmt.Errorf("blob/disk: put %q: %w", key, err)
	}
	return nil
}

// fileRange reads a range of an open file. Its WriteTo hands the
// *io.LimitedReader of the *os.File on, so that an http.ResponseWriter
// sends it with sendfile(2).
type fileRange struct {
	f  *os.File
	lr *io.LimitedReader
}

func (r *fileRange) Read(p []byte) (int, error)         { return r.lr.Read(p) }
func (r *fileRange) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, r.lr) }
func (r *fileRange) Close() error                       { return r.f.Close() }

// Open reads the bytes [off, off+n) of key.
func (s *Store) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, blob.Info, error) {
	if err := s.check("open", key); err != nil {
		return nil, blob.Info{}, err
	}
	if off < 0 {
		return nil, blob.Info{}, fmt.Errorf("blob/disk: open %q: negative offset %d", key, off)
	}
	f, err := os.Open(s.path(key))
	if err != nil {
		return nil, blob.Info{}, s.fileErr("open", key, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, blob.Info{}, fmt.Errorf("blob/disk: open %q: %w", key, err)
	}
	info := blob.Info{Size: st.Size()}
	if off > info.Size {
		off = info.Size
	}
	left := info.Size - off
	if n >= 0 && n < left {
		left = n
	}
	if off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			f.Close()
			return nil, blob.Info{}, fmt.Errorf("blob/disk: open %q: %w", key, err)
		}
	}
	return &fileRange{f: f, lr: &io.LimitedReader{R: f, N: left}}, info, nil
}

func (s *Store) fileErr(op, key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob/disk: %s %q: %w", op, key, blob.ErrNotFound)
	}
	return fmt.Errorf("blob/disk: %s %q: %w", op, key, err)
}

// Stat returns key's size.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := s.check("stat", key); err != nil {
		return blob.Info{}, err
	}
	st, err := os.Stat(s.path(key))
	if err != nil {
		return blob.Info{}, s.fileErr("stat", key, err)
	}
	return blob.Info{Size: st.Size()}, nil
}

// Delete removes key; the directory is fsynced so that the removal
// survives a crash.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check("delete", key); err != nil {
		return err
	}
	name := s.path(key)
	if err := os.Remove(name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("blob/disk: delete %q: %w", key, err)
	}
	if err := syncDir(filepath.Dir(name)); err != nil {
		return fmt.Errorf("blob/disk: delete %q: %w", key, err)
	}
	return nil
}

// validUpload reports whether id has the form Create gives (32 hex
// digits), so that it names a directory under uploads and nothing else.
func validUpload(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

// Create makes the upload's directory under a temporary name with its key
// file, then renames it into place.
func (s *Store) Create(ctx context.Context, key string) (string, error) {
	if err := s.check("create", key); err != nil {
		return "", err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	tmp := filepath.Join(s.uploads, tmpPrefix+id)
	if err := os.Mkdir(tmp, privatefs.DirMode); err != nil {
		return "", fmt.Errorf("blob/disk: create %q: %w", key, err)
	}
	err := func() error {
		if err := os.Chmod(tmp, privatefs.DirMode); err != nil {
			return err
		}
		f, err := tempFile(tmp)
		if err != nil {
			return err
		}
		if _, err := f.WriteString(key); err != nil {
			f.Close()
			return err
		}
		if err := commit(f, filepath.Join(tmp, "key"), "create"); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(s.uploads, id)); err != nil {
			return err
		}
		return syncDir(s.uploads)
	}()
	if err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("blob/disk: create %q: %w", key, err)
	}
	return id, nil
}

// acquire returns the shared state of upload id, held until release.
func (s *Store) acquire(id string) *upState {
	s.umu.Lock()
	defer s.umu.Unlock()
	u := s.pending[id]
	if u == nil {
		u = &upState{end: -1}
		s.pending[id] = u
	}
	u.refs++
	return u
}

func (s *Store) release(id string, u *upState) {
	s.umu.Lock()
	defer s.umu.Unlock()
	if u.refs--; u.refs == 0 {
		delete(s.pending, id)
	}
}

// upload returns the directory of an upload of key, or ErrNotFound.
func (s *Store) upload(op, key, id string) (string, error) {
	if err := s.check(op, key); err != nil {
		return "", err
	}
	if !validUpload(id) {
		return "", fmt.Errorf("blob/disk: %s %q: upload %q: %w", op, key, id, blob.ErrNotFound)
	}
	dir := filepath.Join(s.uploads, id)
	b, err := os.ReadFile(filepath.Join(dir, "key"))
	if err != nil {
		return "", s.fileErr(op, key, err)
	}
	if string(b) != key {
		return "", fmt.Errorf("blob/disk: %s %q: upload %q is of another key: %w", op, key, id, blob.ErrNotFound)
	}
	return dir, nil
}

func partName(n int) string { return fmt.Sprintf("%05d", n) }

// isPartName reports whether name is a part descriptor's name.
func isPartName(name string) bool {
	if len(name) != 5 {
		return false
	}
	n, err := strconv.Atoi(name)
	return err == nil && n >= 1 && n <= blob.MaxParts
}

// part is a part as its descriptor holds it: where its bytes are in data.
type part struct {
	blob.Part
	off int64
}

// reserve returns the offset in data of a new part of size bytes. The
// first reservation of the state reads the descriptors: bytes past the
// last part a descriptor names are what a failed or crashed write left,
// and are written over.
func (u *upState) reserve(dir string, size int64) (int64, error) {
	u.amu.Lock()
	defer u.amu.Unlock()
	if u.end < 0 {
		parts, err := readParts(dir)
		if err != nil {
			return 0, err
		}
		u.end = 0
		for _, p := range parts {
			u.end = max(u.end, p.off+p.Size)
		}
	}
	off := u.end
	u.end += size
	return off, nil
}

// unreserve gives back a reservation whose write failed when it is still
// the last one, so that the next part follows the previous one directly.
func (u *upState) unreserve(off, size int64) {
	u.amu.Lock()
	defer u.amu.Unlock()
	if u.end == off+size {
		u.end = off
	}
}

// openData opens the upload's data file, creating it private.
func openData(dir string) (*os.File, error) {
	name := filepath.Join(dir, dataName)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, privatefs.FileMode)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(privatefs.FileMode); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// PutPart writes the part's bytes into data past every other part,
// fsyncs them, then writes its descriptor (replacing an earlier part n's:
// that one's bytes stay unused in data until the upload ends).
func (s *Store) PutPart(ctx context.Context, key, upload string, n int, r io.Reader, size int64) (blob.Part, error) {
	if err := s.check("put part", key); err != nil {
		return blob.Part{}, err
	}
	u := s.acquire(upload)
	defer s.release(upload, u)
	u.mu.RLock()
	defer u.mu.RUnlock()
	dir, err := s.upload("put part", key, upload)
	if err != nil {
		return blob.Part{}, err
	}
	if n < 1 || n > blob.MaxParts {
		return blob.Part{}, fmt.Errorf("blob/disk: put part %q: part %d: %w", key, n, blob.ErrBadParts)
	}
	if size < 0 {
		return blob.Part{}, fmt.Errorf("blob/disk: put part %q: size %d: %w", key, size, blob.ErrSize)
	}
	f, err := openData(dir)
	if err != nil {
		return blob.Part{}, s.fileErr("put part", key, err)
	}
	off, err := u.reserve(dir, size)
	if err == nil {
		err = copyExact(ctx, io.NewOffsetWriter(f, off), r, size, nil)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		u.unreserve(off, size)
		return blob.Part{}, fmt.Errorf("blob/disk: put part %q: %w", key, err)
	}
	step("part.data")
	var desc [descSize]byte
	_, _ = rand.Read(desc[:tagSize])
	binary.BigEndian.PutUint64(desc[tagSize:], uint64(off))
	binary.BigEndian.PutUint64(desc[tagSize+8:], uint64(size))
	d, err := tempFile(dir)
	if err != nil {
		return blob.Part{}, s.fileErr("put part", key, err)
	}
	if _, err := d.Write(desc[:]); err != nil {
		d.Close()
		os.Remove(d.Name())
		return blob.Part{}, fmt.Errorf("blob/disk: put part %q: %w", key, err)
	}
	if err := commit(d, filepath.Join(dir, partName(n)), "part"); err != nil {
		return blob.Part{}, s.fileErr("put part", key, err)
	}
	return blob.Part{N: n, Size: size, ETag: hex.EncodeToString(desc[:tagSize])}, nil
}

// readDesc reads the part descriptor file name.
func readDesc(name string) (part, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return part{}, err
	}
	if len(b) != descSize {
		return part{}, fmt.Errorf("part descriptor %s has %d bytes, not %d", name, len(b), descSize)
	}
	n, _ := strconv.Atoi(filepath.Base(name))
	off, size := binary.BigEndian.Uint64(b[tagSize:]), binary.BigEndian.Uint64(b[tagSize+8:])
	if off > math.MaxInt64/2 || size > math.MaxInt64/2 {
		return part{}, fmt.Errorf("part descriptor %s: offset %d, size %d", name, off, size)
	}
	return part{Part: blob.Part{N: n, Size: int64(size), ETag: hex.EncodeToString(b[:tagSize])}, off: int64(off)}, nil
}

// readParts reads the descriptors of the upload in dir, by number.
func readParts(dir string) ([]part, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	parts := []part{}
	for _, e := range entries {
		if !isPartName(e.Name()) {
			continue
		}
		p, err := readDesc(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
	}
	slices.SortFunc(parts, func(a, b part) int { return a.N - b.N })
	return parts, nil
}

// Parts lists the part descriptors of the upload.
func (s *Store) Parts(ctx context.Context, key, upload string) ([]blob.Part, error) {
	if err := s.check("parts", key); err != nil {
		return nil, err
	}
	u := s.acquire(upload)
	defer s.release(upload, u)
	u.mu.RLock()
	defer u.mu.RUnlock()
	dir, err := s.upload("parts", key, upload)
	if err != nil {
		return nil, err
	}
	have, err := readParts(dir)
	if err != nil {
		return nil, s.fileErr("parts", key, err)
	}
	parts := make([]blob.Part, len(have))
	for i, p := range have {
		parts[i] = p.Part
	}
	return parts, nil
}

// Complete makes the object of the parts: data itself, renamed over key,
// when they lie in it end to end from its start (truncated after the
// last one); else a new file they are copied into. Then the upload is
// removed.
func (s *Store) Complete(ctx context.Context, key, upload string, parts []blob.Part) error {
	if err := s.check("complete", key); err != nil {
		return err
	}
	u := s.acquire(upload)
	defer s.release(upload, u)
	u.mu.Lock()
	defer u.mu.Unlock()
	dir, err := s.upload("complete", key, upload)
	if err != nil {
		return err
	}
	held, err := readParts(dir)
	if err != nil {
		return s.fileErr("complete", key, err)
	}
	have := make([]blob.Part, len(held))
	at := make(map[int]int64, len(held))
	for i, p := range held {
		have[i] = p.Part
		at[p.N] = p.off
	}
	if err := blob.CheckParts(parts, have); err != nil {
		return fmt.Errorf("blob/disk: complete %q: %w", key, err)
	}
	var total int64
	inPlace := true
	for _, p := range parts {
		inPlace = inPlace && at[p.N] == total
		total += p.Size
	}
	name := s.path(key)
	if inPlace {
		err = s.join(dir, name, total)
	} else {
		err = copyParts(ctx, dir, name, parts, at)
	}
	if err != nil {
		return fmt.Errorf("blob/disk: complete %q: %w", key, err)
	}
	if err := s.remove(dir, upload); err != nil {
		return fmt.Errorf("blob/disk: complete %q: %w", key, err)
	}
	return nil
}

// join makes dir's data, holding the parts end to end, the object name:
// truncated to total, renamed, its new directory fsynced.
func (s *Store) join(dir, name string, total int64) error {
	data := filepath.Join(dir, dataName)
	f, err := os.OpenFile(data, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err == nil && st.Size() < total {
		err = fmt.Errorf("%s holds %d bytes, the parts %d", data, st.Size(), total)
	}
	if err == nil && st.Size() > total {
		if err = f.Truncate(total); err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	step("join.synced")
	if err := os.Rename(data, name); err != nil {
		return err
	}
	step("join.renamed")
	return syncDir(filepath.Dir(name))
}

// copyParts copies the parts, in order, from dir's data into a temporary
// file and commits it as name.
func copyParts(ctx context.Context, dir, name string, parts []blob.Part, at map[int]int64) error {
	in, err := os.Open(filepath.Join(dir, dataName))
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := tempFile(filepath.Dir(name))
	if err != nil {
		return err
	}
	for _, p := range parts {
		err = ctx.Err()
		if err == nil {
			_, err = in.Seek(at[p.N], io.SeekStart)
		}
		var copied int64
		if err == nil {
			// *os.File from an *io.LimitedReader of an *os.File: the
			// kernel copies (copy_file_range), no byte passes through
			// this process.
			copied, err = out.ReadFrom(&io.LimitedReader{R: in, N: p.Size})
		}
		if err == nil && copied != p.Size {
			err = fmt.Errorf("part %d: copied %d of %d bytes", p.N, copied, p.Size)
		}
		if err != nil {
			out.Close()
			os.Remove(out.Name())
			return err
		}
	}
	return commit(out, name, "complete")
}

// remove forgets an upload: its directory is renamed aside (atomic: the
// upload is gone), then deleted. A crash in between leaves a ".dead-"
// directory that Open deletes.
func (s *Store) remove(dir, id string) error {
	dead := filepath.Join(s.uploads, deadMark+id)
	if err := os.Rename(dir, dead); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // a concurrent Complete or Abort took it
		}
		return err
	}
	if err := syncDir(s.uploads); err != nil {
		return err
	}
	step("remove.renamed")
	return os.RemoveAll(dead)
}

// Abort forgets an upload; an unknown one is no error.
func (s *Store) Abort(ctx context.Context, key, upload string) error {
	if err := s.check("abort", key); err != nil {
		return err
	}
	u := s.acquire(upload)
	defer s.release(upload, u)
	u.mu.Lock()
	defer u.mu.Unlock()
	dir, err := s.upload("abort", key, upload)
	if errors.Is(err, blob.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.remove(dir, upload); err != nil {
		return fmt.Errorf("blob/disk: abort %q: %w", key, err)
	}
	return nil
}
