package clustertest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/protocol"
)

// TestAttachmentAcrossGateways: alice, on one gateway, uploads a file of
// two parts to the S3 server through presigned URLs and sends it in a
// group; bob, on the other gateway, gets the message with its
// attachment_id and downloads the file (whole and a range) from the S3
// server through the presigned URL attachment_url answers; a member
// removed afterwards is refused a URL, and after a recall the object is
// gone from S3. Real processes on Cassandra, Redis, NATS and S3.
func TestAttachmentAcrossGateways(t *testing.T) {
	s3 := enginetest.S3(t)
	c := Start(t, Options{Gateways: 2, Chats: 2, Extra: []string{
		"--attach.max-file-bytes", "104857600", "--attach.part-bytes", "5242880", "--attach.engine", "s3",
		"--attach.s3.endpoint", s3.Endpoint, "--attach.s3.bucket", s3.Bucket, "--attach.s3.region", s3.Region,
		"--attach.s3.access-key", s3.AccessKey, "--attach.s3.secret-key", s3.SecretKey,
	}})
	alice := dialLive(t, c, c.Gateways[0], "alice")
	bob := dialLive(t, c, c.Gateways[1], "bob")
	carol := dialLive(t, c, c.Gateways[1], "carol")
	if alice.node == bob.node {
		t.Fatalf("alice and bob both on %s", alice.node)
	}
	g := alice.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "g", Members: []string{"bob", "carol"}}, protocol.TypeConv).Conv.ConvID

	data := make([]byte, 5<<20+12345)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	up := alice.call(protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: g, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]),
		MediaType: "video/mp4", Name: "clip.mp4"}, protocol.TypeUpload).Upload
	if up.Target != protocol.TargetS3 || up.Parts < 2 {
		t.Fatalf("upload %+v: want an S3 upload of several parts", up)
	}
	for part := 1; part <= up.Parts; part++ {
		p := alice.call(protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: part}, protocol.TypeUpload).Upload
		if !strings.HasPrefix(p.URL, "http") {
			t.Fatalf("part URL %q: want a presigned S3 URL", p.URL)
		}
		from := int64(part-1) * up.PartSize
		to := min(from+up.PartSize, int64(len(data)))
		req, _ := http.NewRequest(http.MethodPut, p.URL, bytes.NewReader(data[from:to]))
		req.ContentLength = to - from
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT part %d to S3: %d %s", part, resp.StatusCode, body)
		}
	}
	done := alice.call(protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: up.AttachmentID}, protocol.TypeUpload).Upload
	if done.State != protocol.UploadComplete {
		t.Fatalf("complete: %+v", done)
	}
	ack := alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: g, ClientMsgID: "f1", Kind: protocol.KindFile,
		AttachmentID: up.AttachmentID, Body: `{"caption":"from the other gateway","duration_ms":4000}`}, protocol.TypeAck)

	deadline := time.Now().Add(10 * time.Second)
	for !bob.has(g, ack.Seq, "f1") {
		if time.Now().After(deadline) {
			t.Fatal("bob got no push of the file message")
		}
		time.Sleep(20 * time.Millisecond)
	}
	bob.mu.Lock()
	m := bob.pushes[g][ack.Seq]
	bob.mu.Unlock()
	if m.Kind != protocol.KindFile || m.AttachmentID != up.AttachmentID || !strings.Contains(m.Body, `"name":"clip.mp4"`) {
		t.Fatalf("bob's push: %+v", m)
	}

	att := bob.call(protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: g, Seq: ack.Seq}, protocol.TypeAttachment).Attachment
	get := func(rng string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodGet, att.URL, nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, got := get("")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("download from S3: %d, %d bytes of %d", resp.StatusCode, len(got), len(data))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "video/mp4" {
		t.Errorf("Content-Type %q, want video/mp4 (response-content-type)", ct)
	}
	if cd := resp.Header.Get("Content-Disposition"); cd != "attachment; filename*=UTF-8''clip.mp4" {
		t.Errorf("Content-Disposition %q (response-content-disposition)", cd)
	}
	resp, got = get("bytes=5242870-5242889") // across the parts' boundary
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, data[5242870:5242890]) {
		t.Fatalf("range from S3: %d %d bytes", resp.StatusCode, len(got))
	}

	alice.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: g, Members: []string{"carol"}}, protocol.TypeConv)
	if r := carol.call(protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: g, Seq: ack.Seq}, protocol.TypeError); r.Code != protocol.CodeNotMember {
		t.Fatalf("removed member: %s, want not_member", frameString(r))
	}
	alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: g, ClientMsgID: "r1", TargetSeq: ack.Seq}, protocol.TypeAck)
	if r := bob.call(protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: g, Seq: ack.Seq}, protocol.TypeError); r.Code != protocol.CodeForbidden {
		t.Fatalf("recalled: %s, want forbidden", frameString(r))
	}
	// The recall deleted the object: the presigned URL bob holds finds
	// nothing any more.
	deadline = time.Now().Add(20 * time.Second)
	for {
		resp, _ := get("bytes=0-0")
		if resp.StatusCode == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the recalled file's object still answers %d", resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
