package crashtest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/parley-im/parley/protocol"
)

// TestKill9MidUpload: parts acknowledged before a kill -9 of the server are
// still received after it restarts on the same data; the client resumes
// with upload_status on a new connection, sends the rest, and the upload
// completes with the file's hash; a part cut off mid-body by the kill is
// simply sent again.
func TestKill9MidUpload(t *testing.T) {
	if testing.Short() {
		t.Skip("a crash cycle")
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	const part = 5 << 20
	n := &node{t: t, addr: freeAddr(t), dataDir: t.TempDir(), keyHex: hex.EncodeToString(key),
		args: []string{"--attach.part-bytes", "5242880"}}
	n.start()
	defer n.stop()

	data := make([]byte, 3*part+12345)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	c := n.mustDial("alice")
	d := c.mustCall(t, protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob"}, protocol.TypeConv)
	u := c.mustCall(t, protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: d.Conv.ConvID, Size: int64(len(data)),
		SHA256: hex.EncodeToString(sum[:]), MediaType: "application/octet-stream", Name: "big.bin"}, protocol.TypeUpload).Upload
	if u.Parts != 4 || u.Target != protocol.TargetParley {
		t.Fatalf("upload %+v", u)
	}
	chunk := func(k int) []byte { return data[(k-1)*part : min(k*part, len(data))] }
	put := func(c *conn, k int, body io.Reader, length int64) (int, map[string]any, error) {
		p := c.mustCall(t, protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: u.AttachmentID, Part: k}, protocol.TypeUpload).Upload
		req, _ := http.NewRequest(http.MethodPut, "http://"+n.addr+p.URL, body)
		req.ContentLength = length
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var m map[string]any
		err = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m, err
	}
	for k := 1; k <= 2; k++ {
		if code, ans, err := put(c, k, bytes.NewReader(chunk(k)), int64(len(chunk(k)))); err != nil || code != 200 || ans["received"] != float64(k) {
			t.Fatalf("part %d: %d %v %v", k, code, ans, err)
		}
	}
	// Part 3 is under way when the server dies: half its bytes sent.
	pr, pw := io.Pipe()
	cut := make(chan error, 1)
	go func() {
		_, _, err := put(c, 3, pr, int64(len(chunk(3))))
		cut <- err
	}()
	if _, err := pw.Write(chunk(3)[:part/2]); err != nil {
		t.Fatal(err)
	}
	n.kill9()
	pw.CloseWithError(io.ErrClosedPipe)
	if err := <-cut; err == nil {
		t.Fatal("the PUT cut by the kill succeeded")
	}
	n.start()

	c = n.mustDial("alice")
	s := c.mustCall(t, protocol.Frame{Type: protocol.TypeUploadStatus, AttachmentID: u.AttachmentID}, protocol.TypeUpload).Upload
	if s.Received != 2 || s.State != protocol.UploadUploading {
		t.Fatalf("after the restart: %+v, want parts 1-2 received", s)
	}
	for k := s.Received + 1; k <= s.Parts; k++ {
		if code, ans, err := put(c, k, bytes.NewReader(chunk(k)), int64(len(chunk(k)))); err != nil || code != 200 || ans["received"] != float64(k) {
			t.Fatalf("part %d after the restart: %d %v %v", k, code, ans, err)
		}
	}
	done := c.mustCall(t, protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: u.AttachmentID}, protocol.TypeUpload).Upload
	if done.State != protocol.UploadComplete || done.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("complete: %+v", done)
	}
}

func (n *node) mustDial(user string) *conn {
	n.t.Helper()
	c, err := n.dial(user)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { c.ws.Close() })
	return c
}

func (c *conn) mustCall(t *testing.T, f protocol.Frame, want string) *protocol.Frame {
	t.Helper()
	r, err := c.call(f)
	if err != nil {
		t.Fatalf("%s: %v", f.Type, err)
	}
	if r.Type != want {
		t.Fatalf("%s: answered %+v, want %s", f.Type, r, want)
	}
	return r
}
