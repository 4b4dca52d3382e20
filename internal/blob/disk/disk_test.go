package disk

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/blob/blobtest"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	blobtest.Run(t, blobtest.Harness{
		Open: func(t *testing.T) blob.Store { return open(t, t.TempDir()) },
		Reopen: func(t *testing.T, s blob.Store) blob.Store {
			d := s.(*Store)
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			return open(t, d.root)
		},
	})
}

// TestPrivateModes writes under a 0755 directory with a permissive umask:
// every file is 0600 and every directory the store made 0700.
func TestPrivateModes(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "blobs")
	s := open(t, dir)
	defer s.Close()
	ctx := context.Background()
	b := []byte("private bytes")
	if err := s.Put(ctx, "f/1", bytes.NewReader(b), int64(len(b)), sha256.Sum256(b)); err != nil {
		t.Fatal(err)
	}
	id, err := s.Create(ctx, "f/2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutPart(ctx, "f/2", id, 1, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700 | fs.ModeDir
		}
		if st.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode(), want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 262 {
		t.Fatalf("walked %d entries, want the store's 256 shards and more", n)
	}
	if st, _ := os.Stat(root); st.Mode().Perm() != 0o755 {
		t.Errorf("the parent directory's mode changed to %v", st.Mode())
	}
}

func TestOneProcessPerDirectory(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if s2, err := Open(dir); err == nil {
		s2.Close()
		t.Fatal("a second Open of a directory in use succeeded")
	}
	s.Close()
	open(t, dir).Close()
}

// TestOpenRangeSendfile checks that Open's reader hands the file to a
// ReaderFrom (sendfile for an http.ResponseWriter) with the range's bound.
func TestOpenRangeSendfile(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	ctx := context.Background()
	b := bytes.Repeat([]byte("0123456789"), 1000)
	if err := s.Put(ctx, "f/1", bytes.NewReader(b), int64(len(b)), sha256.Sum256(b)); err != nil {
		t.Fatal(err)
	}
	rc, _, err := s.Open(ctx, "f/1", 5, 20)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got bytes.Buffer
	wt, ok := rc.(io.WriterTo)
	if !ok {
		t.Fatalf("Open's reader %T is no io.WriterTo", rc)
	}
	n, err := wt.WriteTo(&got)
	if err != nil || n != 20 || got.String() != string(b[5:25]) {
		t.Fatalf("WriteTo = %d, %v, %q", n, err, got.String())
	}
}

// Crash tests: a child process (this test binary, TestCrashChild) stops
// at a named step of a write and is killed with SIGKILL there; the parent
// then reopens the directory and checks what is visible.

const (
	envDir    = "PARLEY_BLOB_CRASH_DIR"
	envStep   = "PARLEY_BLOB_CRASH_STEP"
	envOp     = "PARLEY_BLOB_CRASH_OP"
	envUpload = "PARLEY_BLOB_CRASH_UPLOAD"
)

var (
	oldBytes = bytes.Repeat([]byte("old."), 3000)
	newBytes = bytes.Repeat([]byte("new!"), 5000)
	part1    = bytes.Repeat([]byte("p1"), blob.MinPartSize/2)
	part2    = bytes.Repeat([]byte("p2"), 1000)
)

// TestCrashChild runs only as the child of a crash test.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(envDir)
	if dir == "" {
		t.Skip("runs as the child of TestCrash")
	}
	want := os.Getenv(envStep)
	crashPoint = func(step string) {
		if step == want {
			os.Stdout.WriteString("at " + step + "\n")
			time.Sleep(time.Hour)
		}
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	up := os.Getenv(envUpload)
	switch os.Getenv(envOp) {
	case "put":
		err = s.Put(ctx, "f/x", bytes.NewReader(newBytes), int64(len(newBytes)), sha256.Sum256(newBytes))
	case "part":
		_, err = s.PutPart(ctx, "f/u", up, 2, bytes.NewReader(part2), int64(len(part2)))
	case "complete", "completecopy":
		var parts []blob.Part
		if parts, err = s.Parts(ctx, "f/u", up); err == nil {
			err = s.Complete(ctx, "f/u", up, parts)
		}
	case "create":
		_, err = s.Create(ctx, "f/c")
	case "abort":
		err = s.Abort(ctx, "f/u", up)
	}
	t.Fatalf("the write ended (%v) without reaching step %q", err, want)
}

func TestCrash(t *testing.T) {
	if os.Getenv(envDir) != "" {
		t.Skip("child")
	}
	cases := []struct {
		op, step string
		check    func(t *testing.T, s *Store, up string, parts []blob.Part)
	}{
		{"put", "put.written", func(t *testing.T, s *Store, _ string, _ []blob.Part) { wantObject(t, s, "f/x", oldBytes) }},
		{"put", "put.renamed", func(t *testing.T, s *Store, _ string, _ []blob.Part) { wantObject(t, s, "f/x", newBytes) }},
		{"part", "part.written", func(t *testing.T, s *Store, up string, parts []blob.Part) { wantParts(t, s, up, parts[:1]) }},
		{"part", "part.renamed", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			got := wantPartCount(t, s, up, 2)
			if got[1].Size != int64(len(part2)) {
				t.Fatalf("part 2 after the crash: %+v", got[1])
			}
		}},
		{"part", "part.data", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			wantParts(t, s, up, parts[:1])
			// The bytes the crash left in data are written over: part 2
			// follows part 1 directly, and Complete joins in place.
			p2, err := s.PutPart(context.Background(), "f/u", up, 2, bytes.NewReader(part2), int64(len(part2)))
			if err != nil {
				t.Fatal(err)
			}
			wantJoinedInPlace(t, s, up, append(parts[:1], p2))
		}},
		{"complete", "join.synced", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			wantAbsent(t, s, "f/u")
			wantParts(t, s, up, parts)
			if err := s.Complete(context.Background(), "f/u", up, parts); err != nil {
				t.Fatalf("Complete again after the crash: %v", err)
			}
			wantObject(t, s, "f/u", append(append([]byte(nil), part1...), part2...))
		}},
		{"complete", "join.renamed", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			wantObject(t, s, "f/u", append(append([]byte(nil), part1...), part2...))
			if _, err := s.Parts(context.Background(), "f/u", up); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("Parts of the joined upload after the crash = %v, want ErrNotFound", err)
			}
		}},
		{"completecopy", "complete.written", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			wantAbsent(t, s, "f/u")
			wantParts(t, s, up, parts)
			if err := s.Complete(context.Background(), "f/u", up, parts); err != nil {
				t.Fatalf("Complete again after the crash: %v", err)
			}
			wantObject(t, s, "f/u", append(append([]byte(nil), part1...), part2...))
		}},
		{"completecopy", "complete.renamed", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			wantObject(t, s, "f/u", append(append([]byte(nil), part1...), part2...))
		}},
		{"create", "create.written", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			entries, _ := os.ReadDir(s.uploads)
			if len(entries) != 1 || entries[0].Name() != up {
				t.Fatalf("uploads after a crash in Create: %v, want only %s", entries, up)
			}
		}},
		{"abort", "remove.renamed", func(t *testing.T, s *Store, up string, parts []blob.Part) {
			if _, err := s.Parts(context.Background(), "f/u", up); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("Parts of the aborted upload after the crash = %v, want ErrNotFound", err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.op+"/"+c.step, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			s := open(t, dir)
			if err := s.Put(ctx, "f/x", bytes.NewReader(oldBytes), int64(len(oldBytes)), sha256.Sum256(oldBytes)); err != nil {
				t.Fatal(err)
			}
			up, err := s.Create(ctx, "f/u")
			if err != nil {
				t.Fatal(err)
			}
			p1, err := s.PutPart(ctx, "f/u", up, 1, bytes.NewReader(part1), int64(len(part1)))
			if err != nil {
				t.Fatal(err)
			}
			parts := []blob.Part{p1}
			if c.op == "complete" || c.op == "completecopy" || c.op == "abort" {
				p2, err := s.PutPart(ctx, "f/u", up, 2, bytes.NewReader(part2), int64(len(part2)))
				if err != nil {
					t.Fatal(err)
				}
				parts = append(parts, p2)
			}
			if c.op == "completecopy" {
				// Part 1 sent again goes after part 2 in data: Complete
				// copies.
				p1, err := s.PutPart(ctx, "f/u", up, 1, bytes.NewReader(part1), int64(len(part1)))
				if err != nil {
					t.Fatal(err)
				}
				parts[0] = p1
			}
			s.Close()

			killAt(t, dir, c.op, c.step, up)
			leftovers := names(t, dir)
			s = open(t, dir)
			defer s.Close()
			for _, n := range names(t, dir) {
				if strings.HasPrefix(n, tmpPrefix) || strings.HasPrefix(n, deadMark) {
					t.Errorf("%s left after reopening", n)
				}
			}
			if c.step != "remove.renamed" && !hasPrefixed(leftovers, tmpPrefix) && strings.HasSuffix(c.step, ".written") {
				t.Errorf("the child left no temporary file at %s: the test did not stop where it meant to", c.step)
			}
			c.check(t, s, up, parts)
		})
	}
}

// killAt runs the child until it reports step, then kills it.
func killAt(t *testing.T, dir, op, step, up string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), envDir+"="+dir, envStep+"="+step, envOp+"="+op, envUpload+"="+up)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reached := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "at "+step {
				reached <- true
				return
			}
			t.Logf("child: %s", sc.Text())
		}
		reached <- false
	}()
	select {
	case ok := <-reached:
		if !ok {
			cmd.Wait()
			t.Fatalf("the child ended before step %s", step)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the child did not reach step %s in 30s", step)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, d.Name())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hasPrefixed(names []string, prefix string) bool {
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

func wantObject(t *testing.T, s *Store, key string, want []byte) {
	t.Helper()
	rc, info, err := s.Open(context.Background(), key, 0, -1)
	if err != nil {
		t.Fatalf("Open(%q): %v", key, err)
	}
	defer rc.Close()
	var got bytes.Buffer
	if _, err := got.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(want)) || !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("%q holds %d bytes (size %d), want the %d expected", key, got.Len(), info.Size, len(want))
	}
}

func wantAbsent(t *testing.T, s *Store, key string) {
	t.Helper()
	if _, err := s.Stat(context.Background(), key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat(%q) = %v, want ErrNotFound", key, err)
	}
}

func wantParts(t *testing.T, s *Store, up string, want []blob.Part) {
	t.Helper()
	got := wantPartCount(t, s, up, len(want))
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("Parts = %+v, want %+v", got, want)
		}
	}
}

func wantPartCount(t *testing.T, s *Store, up string, n int) []blob.Part {
	t.Helper()
	got, err := s.Parts(context.Background(), "f/u", up)
	if err != nil {
		t.Fatalf("Parts: %v", err)
	}
	if len(got) != n {
		t.Fatalf("Parts = %+v, want %d parts", got, n)
	}
	return got
}

// wantJoinedInPlace completes the upload with parts and checks that data
// became the object (same inode: no byte copied).
func wantJoinedInPlace(t *testing.T, s *Store, up string, parts []blob.Part) {
	t.Helper()
	before, err := os.Stat(filepath.Join(s.uploads, up, dataName))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(context.Background(), "f/u", up, parts); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(s.path("f/u"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Fatal("Complete of parts in order copied them instead of renaming data")
	}
	var total int64
	for _, p := range parts {
		total += p.Size
	}
	if after.Size() != total {
		t.Fatalf("the object has %d bytes, the parts %d", after.Size(), total)
	}
}

// TestCompleteInPlace: parts sent in order become the object without a
// copy; a replaced or failed part makes Complete copy, and the object is
// the parts all the same.
func TestCompleteInPlace(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	defer s.Close()
	up, err := s.Create(ctx, "f/u")
	if err != nil {
		t.Fatal(err)
	}
	p1, err := s.PutPart(ctx, "f/u", up, 1, bytes.NewReader(part1), int64(len(part1)))
	if err != nil {
		t.Fatal(err)
	}
	// A part that fails (the reader ends early) leaves no gap.
	if _, err := s.PutPart(ctx, "f/u", up, 2, bytes.NewReader(part2[:10]), int64(len(part2))); !errors.Is(err, blob.ErrSize) {
		t.Fatalf("PutPart of a short reader = %v, want ErrSize", err)
	}
	p2, err := s.PutPart(ctx, "f/u", up, 2, bytes.NewReader(part2), int64(len(part2)))
	if err != nil {
		t.Fatal(err)
	}
	wantJoinedInPlace(t, s, up, []blob.Part{p1, p2})
	wantObject(t, s, "f/u", append(append([]byte(nil), part1...), part2...))

	// Part 2 replaced by other bytes: the old ones stay in data, the
	// object is part 1 and the new part 2.
	up, err = s.Create(ctx, "f/u")
	if err != nil {
		t.Fatal(err)
	}
	p1, _ = s.PutPart(ctx, "f/u", up, 1, bytes.NewReader(part1), int64(len(part1)))
	_, _ = s.PutPart(ctx, "f/u", up, 2, bytes.NewReader(oldBytes), int64(len(oldBytes)))
	p2, err = s.PutPart(ctx, "f/u", up, 2, bytes.NewReader(part2), int64(len(part2)))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(filepath.Join(s.uploads, up, dataName))
	if err := s.Complete(ctx, "f/u", up, []blob.Part{p1, p2}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(s.path("f/u"))
	if os.SameFile(before, after) {
		t.Fatal("parts not end to end were renamed, not copied")
	}
	wantObject(t, s, "f/u", append(append([]byte(nil), part1...), part2...))
}
