package clustertest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/testbin"
	"github.com/parley-im/parley/protocol"
)

// embeddedNode is a `parley serve` process on one data directory with
// attachments on disk, restartable on the same address.
type embeddedNode struct {
	t      *testing.T
	dir    string
	addr   string
	cmd    *exec.Cmd
	tokens map[string]string
	rid    int
}

const killPart = 5 << 20

func startEmbedded(t *testing.T) *embeddedNode {
	t.Helper()
	dir := t.TempDir()
	key, err := auth.LoadOrCreateDevKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	n := &embeddedNode{t: t, dir: dir, addr: addr, tokens: map[string]string{}}
	now := time.Now()
	for _, u := range []string{"alice", "bob"} {
		if n.tokens[u], err = auth.MintHS256(key, auth.Claims{User: u, IssuedAt: now, Expires: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	n.start()
	t.Cleanup(func() { n.kill() })
	return n
}

func (n *embeddedNode) start() {
	n.t.Helper()
	n.cmd = exec.Command(binary, "serve", "--listen", n.addr, "--data-dir", n.dir,
		"--attach.part-bytes", strconv.Itoa(killPart), "--attach.max-file-bytes", strconv.Itoa(100<<20))
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	n.cmd.Stderr = os.Stderr
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	if !testbin.Ready(n.addr, 30*time.Second) {
		n.t.Fatal("the node did not get ready in 30s")
	}
}

// kill stops the node with SIGKILL (idempotent).
func (n *embeddedNode) kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Wait()
	n.cmd = nil
}

// rpc sends f as user over POST /v1/rpc; an error frame fails the test.
func (n *embeddedNode) rpc(user string, f protocol.Frame) *protocol.Frame {
	n.t.Helper()
	n.rid++
	f.RID = strconv.Itoa(n.rid)
	body, _ := json.Marshal(f)
	req, _ := http.NewRequest(http.MethodPost, "http://"+n.addr+"/v1/rpc?device=d", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+n.tokens[user])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatalf("%s: %v", f.Type, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out protocol.Frame
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK || out.Type == "error" {
		n.t.Fatalf("%s: %s %s", f.Type, resp.Status, b)
	}
	return &out
}

// put sends body to an upload part URL and returns the status.
func (n *embeddedNode) put(url string, body io.Reader, size int64) (int, error) {
	req, _ := http.NewRequest(http.MethodPut, "http://"+n.addr+url, body)
	req.ContentLength = size
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestAttachmentResumeAfterKill9: an embedded node is killed with SIGKILL
// while a part of an upload is arriving; started again on the same data
// directory, it reports the parts it had stored, the client sends the
// rest from there, and the member downloads exactly the file. No
// temporary file of the crash is left in the blob directory.
func TestAttachmentResumeAfterKill9(t *testing.T) {
	n := startEmbedded(t)
	conv := n.rpc("alice", protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}).Conv.ConvID
	data := make([]byte, 3*killPart+77)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	up := n.rpc("alice", protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: conv, Size: int64(len(data)),
		SHA256: hex.EncodeToString(sum[:]), MediaType: "video/mp4", Name: "clip.mp4"}).Upload
	if up.Parts != 4 || up.Target != protocol.TargetParley {
		t.Fatalf("upload %+v: want 4 parts to the node", up)
	}
	part := func(p int) []byte { return data[(p-1)*killPart : min(p*killPart, len(data))] }
	for p := 1; p <= 2; p++ {
		u := n.rpc("alice", protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: p}).Upload
		if st, err := n.put(u.URL, bytes.NewReader(part(p)), int64(len(part(p)))); err != nil || st != http.StatusOK {
			t.Fatalf("PUT part %d: %d, %v", p, st, err)
		}
	}
	// Part 3: half its bytes arrive, then the node is killed.
	u := n.rpc("alice", protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: 3}).Upload
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := n.put(u.URL, pr, int64(len(part(3))))
		done <- err
	}()
	if _, err := pw.Write(part(3)[:killPart/2]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the node reads what was written
	n.kill()
	pw.CloseWithError(fmt.Errorf("the node was killed"))
	if err := <-done; err == nil {
		t.Fatal("the PUT of part 3 succeeded although the node was killed mid-part")
	}

	n.start()
	st := n.rpc("alice", protocol.Frame{Type: protocol.TypeUploadStatus, AttachmentID: up.AttachmentID}).Upload
	if st.State != protocol.UploadUploading || st.Received != 2 {
		t.Fatalf("status after the restart: %+v, want uploading with 2 parts received", st)
	}
	for p := st.Received + 1; p <= st.Parts; p++ {
		u := n.rpc("alice", protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: p}).Upload
		if st, err := n.put(u.URL, bytes.NewReader(part(p)), int64(len(part(p)))); err != nil || st != http.StatusOK {
			t.Fatalf("PUT part %d after the restart: %d, %v", p, st, err)
		}
	}
	if c := n.rpc("alice", protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: up.AttachmentID}).Upload; c.State != protocol.UploadComplete {
		t.Fatalf("upload_complete after the restart: %+v", c)
	}
	seq := n.rpc("alice", protocol.Frame{Type: protocol.TypeSend, ConvID: conv, Kind: protocol.KindFile,
		AttachmentID: up.AttachmentID, ClientMsgID: "kill9"}).Seq
	a := n.rpc("bob", protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: conv, Seq: seq}).Attachment
	resp, err := http.Get("http://" + n.addr + a.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("download: %s, %d bytes (want %d, equal %v), %v", resp.Status, len(got), len(data), bytes.Equal(got, data), err)
	}
	err = filepath.WalkDir(filepath.Join(n.dir, "blobs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && (strings.HasPrefix(d.Name(), ".tmp-") || strings.HasPrefix(d.Name(), ".dead-")) {
			t.Errorf("%s left in the blob directory", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
