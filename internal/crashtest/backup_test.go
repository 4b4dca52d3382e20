package crashtest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-im/parley/protocol"
)

// TestKill9DuringBackup: a kill -9 of the server while `parley backup`
// streams its archive makes the command fail without leaving an archive;
// the restarted node has removed the half-taken checkpoints and lost
// nothing, and a backup taken then restores into a node with every
// message.
func TestKill9DuringBackup(t *testing.T) {
	if testing.Short() {
		t.Skip("a crash cycle")
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	adminKey := make([]byte, 32)
	_, _ = rand.Read(adminKey)
	adminAddr := freeAddr(t)
	admin := []string{"--admin.listen", adminAddr, "--admin.key", hex.EncodeToString(adminKey)}
	n := &node{t: t, addr: freeAddr(t), dataDir: t.TempDir(), keyHex: hex.EncodeToString(key),
		args: append([]string{"--attach.part-bytes", "5242880"}, admin...)}
	n.start()
	defer n.stop()

	c := n.mustDial("alice")
	d := c.mustCall(t, protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}, protocol.TypeConv)
	conv := d.Conv.ConvID
	for i := 0; i < 50; i++ {
		c.mustCall(t, protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: fmt.Sprintf("m%d", i), Body: fmt.Sprintf("message %d", i)}, protocol.TypeAck)
	}
	// 20 MiB of attachment files, so the archive is far larger than what
	// the pipe and socket buffers hold.
	for k := 0; k < 4; k++ {
		data := make([]byte, 5<<20)
		_, _ = rand.Read(data)
		sum := sha256.Sum256(data)
		u := c.mustCall(t, protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: conv, Size: int64(len(data)),
			SHA256: hex.EncodeToString(sum[:]), MediaType: "application/octet-stream", Name: "f.bin"}, protocol.TypeUpload).Upload
		p := c.mustCall(t, protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: u.AttachmentID, Part: 1}, protocol.TypeUpload).Upload
		req, _ := http.NewRequest(http.MethodPut, "http://"+n.addr+p.URL, bytes.NewReader(data))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("part: %v %v", resp, err)
		}
		resp.Body.Close()
		c.mustCall(t, protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: u.AttachmentID}, protocol.TypeUpload)
	}

	// The backup writes to a pipe this test reads slowly: the server is
	// still streaming when it dies.
	backup := exec.Command(binary, append([]string{"backup", "-out", "-"}, admin...)...)
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	backup.Stdout, backup.Stderr = pw, &stderr
	if err := backup.Start(); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(pr, head); err != nil {
		t.Fatalf("the first MiB of the archive: %v (%s)", err, stderr.String())
	}
	left, _ := filepath.Glob(filepath.Join(n.dataDir, ".backup-*"))
	if len(left) != 1 {
		t.Fatalf("checkpoints in the data directory mid-backup: %v", left)
	}
	n.kill9()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	err := backup.Wait()
	pw.Close()
	if err == nil || !strings.Contains(stderr.String(), "incomplete") {
		t.Fatalf("backup cut by the kill: %v, %q", err, stderr.String())
	}

	n.start()
	if left, _ := filepath.Glob(filepath.Join(n.dataDir, ".backup-*")); len(left) != 0 {
		t.Fatalf("the restarted node kept the dead backup's checkpoints: %v", left)
	}
	c = n.mustDial("alice")
	h := c.mustCall(t, protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, Limit: 100}, protocol.TypeHistory)
	if len(h.Messages) != 50 {
		t.Fatalf("after the restart the conversation has %d messages, want 50", len(h.Messages))
	}

	// A backup now completes and restores.
	dir := t.TempDir()
	archive := filepath.Join(dir, "b.tar")
	if out, err := exec.Command(binary, append([]string{"backup", "-out", archive}, admin...)...).CombinedOutput(); err != nil {
		t.Fatalf("backup after the restart: %v\n%s", err, out)
	}
	restored := filepath.Join(dir, "data")
	if out, err := exec.Command(binary, "restore", "-from", archive, "-data-dir", restored).CombinedOutput(); err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	n.stop()
	r := &node{t: t, addr: freeAddr(t), dataDir: restored, keyHex: n.keyHex}
	r.start()
	defer r.stop()
	c = r.mustDial("alice")
	h = c.mustCall(t, protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, Limit: 100}, protocol.TypeHistory)
	if len(h.Messages) != 50 || h.Messages[len(h.Messages)-1].Body != "message 49" && h.Messages[0].Body != "message 49" {
		t.Fatalf("the restored node has %d messages", len(h.Messages))
	}
	if st, err := os.Stat(filepath.Join(restored, "blobs")); err != nil || !st.IsDir() {
		t.Fatalf("restored blobs: %v", err)
	}
}
