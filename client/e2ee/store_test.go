package e2ee

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// childEnv tells the test binary, re-executed by childStore, which part of
// TestFileStoreChildProcess to play: "open DIR", "hold DIR" or "write DIR".
const childEnv = "PARLEY_E2EE_STORE_CHILD"

// childStore starts this test binary again as a second process that plays
// mode on dir (see TestFileStoreChildProcess); it returns the command and
// its first output line.
func childStore(t *testing.T, mode, dir string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFileStoreChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode+" "+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child %s: %v", mode, err)
	}
	return cmd, strings.TrimSpace(line)
}

// TestFileStoreChildProcess is the second process of the FileStore tests;
// run directly, it does nothing.
func TestFileStoreChildProcess(t *testing.T) {
	v := os.Getenv(childEnv)
	if v == "" {
		t.Skip("the second process of the FileStore tests")
	}
	mode, dir, _ := strings.Cut(v, " ")
	fs, err := OpenFileStore(dir)
	switch {
	case errors.Is(err, ErrLocked):
		os.Stdout.WriteString("locked\n")
		os.Exit(0)
	case err != nil:
		os.Stdout.WriteString("error " + err.Error() + "\n")
		os.Exit(1)
	}
	switch mode {
	case "open":
		os.Stdout.WriteString("opened\n")
		os.Exit(0)
	case "hold":
		os.Stdout.WriteString("holding\n")
		time.Sleep(time.Minute)
	case "write":
		// Rewrites one key with values of one repeated byte each, until
		// killed; "n" counts the writes done.
		for i := 0; ; i++ {
			if err := fs.Save("k", bytes.Repeat([]byte{byte(i)}, 256<<10)); err != nil {
				os.Stdout.WriteString("error " + err.Error() + "\n")
				os.Exit(1)
			}
			if err := fs.Save("n", []byte(strconv.Itoa(i+1))); err != nil {
				os.Stdout.WriteString("error " + err.Error() + "\n")
				os.Exit(1)
			}
			if i == 0 {
				os.Stdout.WriteString("writing\n")
			}
		}
	}
	os.Exit(2)
}

// Two processes on one device's keys would encrypt with the same message
// keys: the second gets ErrLocked until the first closes the store or
// exits.
func TestFileStoreLockedByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	fs, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, got := childStore(t, "open", dir); got != "locked" {
		t.Fatalf("second process on a held key directory: %q, want locked", got)
	}
	// A second FileStore in the same process is refused too.
	if _, err := OpenFileStore(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("second FileStore in the process: %v, want ErrLocked", err)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := fs.Save("k", []byte("v")); err == nil {
		t.Fatal("Save after Close succeeded without the lock")
	}
	child, got := childStore(t, "open", dir)
	if got != "opened" {
		t.Fatalf("second process after Close: %q, want opened", got)
	}
	child.Wait() // its lock goes with it

	// The lock dies with its process.
	child, got = childStore(t, "hold", dir)
	if got != "holding" {
		t.Fatalf("child: %q", got)
	}
	if _, err := OpenFileStore(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("key directory held by another process: %v, want ErrLocked", err)
	}
	child.Process.Kill()
	child.Wait()
	fs, err = OpenFileStore(dir)
	if err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
	fs.Close()
}

// Save fsyncs the temporary file before the rename and the directory after
// it (a rename is durable only once its directory is synced), Delete the
// directory after the removal.
func TestFileStoreSaveSyncs(t *testing.T) {
	dir := t.TempDir()
	fs, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	var got []string
	fs.syncFile = func(f *os.File) error {
		what := filepath.Base(f.Name())
		if f.Name() == dir {
			what = "dir"
			if b, err := os.ReadFile(fs.path("key")); err == nil {
				what += " with key=" + string(b)
			} else {
				what += " without key"
			}
		} else if strings.HasPrefix(what, ".tmp-") {
			b, _ := os.ReadFile(f.Name())
			what = "tmp=" + string(b)
		}
		got = append(got, what)
		return f.Sync()
	}
	if err := fs.Save("key", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := fs.Delete("key"); err != nil {
		t.Fatal(err)
	}
	want := []string{"tmp=v1", "dir with key=v1", "dir without key"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("syncs %q, want %q", got, want)
	}

	fs.syncFile = func(f *os.File) error {
		if f.Name() == dir {
			return errors.New("disk gone")
		}
		return f.Sync()
	}
	if err := fs.Save("key", []byte("v2")); err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Fatalf("Save with a failing directory sync: %v", err)
	}
}

// A process killed in the middle of writes leaves a store that opens, with
// each key holding one whole value, and no temporary file once reopened.
func TestFileStoreKilledMidWrite(t *testing.T) {
	dir := t.TempDir()
	for _, wait := range []time.Duration{0, 7 * time.Millisecond, 40 * time.Millisecond} {
		child, got := childStore(t, "write", dir)
		if got != "writing" {
			t.Fatalf("child: %q", got)
		}
		time.Sleep(wait)
		child.Process.Kill()
		child.Wait()

		fs, err := OpenFileStore(dir)
		if err != nil {
			t.Fatalf("reopen after a kill: %v", err)
		}
		v, err := fs.Load("k")
		if err != nil || len(v) != 256<<10 || !bytes.Equal(v, bytes.Repeat(v[:1], len(v))) {
			t.Fatalf("key after a kill: %d bytes, %v", len(v), err)
		}
		n, err := fs.Load("n")
		if i, _ := strconv.Atoi(string(n)); err != nil || i < 1 || byte(i-1) != v[0] && byte(i) != v[0] {
			t.Fatalf("after %d writes the key holds write %d (%v)", i, v[0], err)
		}
		if tmps, _ := filepath.Glob(filepath.Join(dir, ".tmp-*")); len(tmps) != 0 {
			t.Fatalf("temporary files left: %v", tmps)
		}
		if keys, err := fs.List(""); err != nil || strings.Join(keys, ",") != "k,n" {
			t.Fatalf("keys %v %v", keys, err)
		}
		fs.Close()
	}
}

// No key's file can be the lock or a temporary file.
func TestFileStoreDotKeys(t *testing.T) {
	dir := t.TempDir()
	fs, err := OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	for _, k := range []string{".lock", ".tmp-1", "a/.b"} {
		if err := fs.Save(k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := OpenFileStore(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("the lock after saving key .lock: %v", err)
	}
	keys, err := fs.List("")
	if err != nil || strings.Join(keys, ",") != ".lock,.tmp-1,a/.b" {
		t.Fatalf("keys %q %v", keys, err)
	}
	for _, k := range keys {
		if b, _ := fs.Load(k); string(b) != k {
			t.Fatalf("%s = %q", k, b)
		}
	}
}
