package e2e

import (
	"bytes"
	"io"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-im/parley/protocol"
)

// TestUploadLies: on each engine pair, a real node refuses what a lying
// client sends — a part with fewer bytes than it has (not counted), a
// part out of order, completion before every part, a file whose bytes do
// not hash to the declared SHA-256 (deleted: the engine holds nothing of
// it, and the upload is gone) — with the documented codes, and announces
// its attachment sizes in hello.
func TestUploadLies(t *testing.T) {
	attachEngines(t, func(t *testing.T, n *attachNode) {
		alice := dialRaw(t, n.srv, "alice", "phone")
		if alice.hello.MaxFileBytes != 100<<20 || alice.hello.PartBytes != 8<<20 {
			t.Fatalf("hello sizes %d %d", alice.hello.MaxFileBytes, alice.hello.PartBytes)
		}
		conv := alice.openDirect("bob")
		data := randomBytes(8<<20 + 4096)
		declared := randomBytes(len(data)) // the hash of other bytes
		up := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: conv, Size: int64(len(data)),
			SHA256: sha256Hex(declared), MediaType: "application/octet-stream", Name: "lie.bin"}), protocol.TypeUpload).Upload
		wantErr(t, "upload_part 2 first", alice.call(protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: 2}),
			protocol.CodePartOutOfOrder, http.StatusConflict)
		put := func(part int, body []byte) int {
			t.Helper()
			p := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: part}), protocol.TypeUpload).Upload
			req, _ := http.NewRequest(http.MethodPut, n.abs(p.URL), bytes.NewReader(body))
			req.ContentLength = int64(len(body))
			resp, err := n.client(p.URL).Do(req)
			if err != nil {
				t.Fatalf("PUT part %d: %v", part, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !n.s3 && resp.StatusCode != 200 && !strings.Contains(string(b), `"code"`) {
				t.Fatalf("PUT part %d: %d %s without a code", part, resp.StatusCode, b)
			}
			return resp.StatusCode
		}
		first := data[:up.PartSize]
		if code := put(1, first[:1000]); !n.s3 && code != http.StatusBadRequest {
			t.Fatalf("short part on Parley's endpoint: %d, want 400 size_mismatch", code)
		}
		st := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeUploadStatus, AttachmentID: up.AttachmentID}), protocol.TypeUpload).Upload
		if st.Received != 0 {
			t.Fatalf("a short part was counted: %+v", st)
		}
		if code := put(1, first); code != 200 {
			t.Fatalf("part 1: %d", code)
		}
		wantErr(t, "complete before part 2", alice.call(protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: up.AttachmentID}),
			protocol.CodeUploadIncomplete, http.StatusConflict)
		if code := put(2, data[up.PartSize:]); code != 200 {
			t.Fatalf("part 2: %d", code)
		}
		wantErr(t, "complete with a lying hash", alice.call(protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: up.AttachmentID}),
			protocol.CodeHashMismatch, http.StatusBadRequest)
		if n.blobsHold(t, up.AttachmentID, data) {
			t.Fatal("the engine still holds the lying file")
		}
		if !n.s3 {
			// Nor any of its parts.
			_ = filepath.WalkDir(filepath.Join(n.srv.DataDir, "blobs"), func(path string, d fs.DirEntry, err error) error {
				if info, ierr := d.Info(); err == nil && ierr == nil && info.Mode().IsRegular() && info.Size() > 4096 {
					t.Errorf("the disk engine still holds %s (%d bytes)", path, info.Size())
				}
				return nil
			})
		}
		wantErr(t, "status of the deleted upload", alice.call(protocol.Frame{Type: protocol.TypeUploadStatus, AttachmentID: up.AttachmentID}),
			protocol.CodeNotFound, http.StatusNotFound)
		wantErr(t, "a file message naming it", alice.sendFile(conv, "m1", up.AttachmentID, ""), protocol.CodeNotFound, http.StatusNotFound)
	})
}
