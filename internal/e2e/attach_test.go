package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/blob"
	blobs3 "github.com/parley-im/parley/internal/blob/s3"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/enginetest"
	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/cassandra"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/webhook"
)

// Attachments end to end: a real node (Pebble and the disk blob engine;
// Cassandra and S3 when PARLEY_TEST_CASSANDRA and PARLEY_TEST_S3 are set),
// uploads through the protocol and the URLs it answers, file messages,
// downloads by other members, and the rules of who may download what.

// attachNode is a node of one engine pair and what a test checks the
// engine with.
type attachNode struct {
	srv *servertest.Server
	// s3: the node's URLs are presigned S3 URLs (absolute), served by the
	// S3 server; else Parley's own endpoints (relative).
	s3 bool
	// blobsHold reports whether the engine still holds attachment id's
	// file (whose bytes are data).
	blobsHold func(t *testing.T, id uint64, data []byte) bool
}

// attachEngines runs f once per engine pair: Pebble + disk always,
// Cassandra + S3 when their variables are set (skipped without them,
// failed under CI).
func attachEngines(t *testing.T, f func(t *testing.T, n *attachNode), opts ...servertest.Option) {
	t.Run("pebble+disk", func(t *testing.T) {
		srv := servertest.Start(t, opts...)
		f(t, &attachNode{srv: srv, blobsHold: func(t *testing.T, _ uint64, data []byte) bool { return dirHolds(t, srv.DataDir, data) }})
	})
	t.Run("cassandra+s3", func(t *testing.T) {
		f(t, cassandraS3Node(t, opts...))
	})
}

// cassandraS3Node starts a node whose chat service stores in a fresh
// Cassandra keyspace and whose attachments live on the S3 server of
// PARLEY_TEST_S3 (each skipped without its variable, failed under CI).
func cassandraS3Node(t *testing.T, opts ...servertest.Option) *attachNode {
	t.Helper()
	s3 := enginetest.S3(t)
	cs := cassandraStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The node keeps its objects at the bucket's root (attach.s3 has no
	// prefix); the test's own store there reads them back.
	root := s3
	root.Prefix = ""
	check, err := blobs3.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check.Close() })
	srv := servertest.Start(t, append([]servertest.Option{
		servertest.WithDeps(func(d *server.Deps) { d.WrapStore = func(store.Store) store.Store { return cs } }),
		servertest.WithConfig(func(c *config.Config) {
			c.Attach.Engine = attach.EngineS3
			c.Attach.S3 = attach.S3{Endpoint: s3.Endpoint, Bucket: s3.Bucket, Region: s3.Region,
				AccessKey: s3.AccessKey, SecretKey: s3.SecretKey, Secure: s3.Secure}
		}),
	}, opts...)...)
	return &attachNode{srv: srv, s3: true, blobsHold: func(t *testing.T, id uint64, _ []byte) bool {
		_, err := check.Stat(context.Background(), attach.FileKey(id))
		if err != nil && !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("S3 stat: %v", err)
		}
		return err == nil
	}}
}

// cassandraStore is a store on a fresh keyspace of PARLEY_TEST_CASSANDRA
// (skipped without it, except under CI), dropped after the test.
func cassandraStore(t *testing.T) store.Store {
	t.Helper()
	addr := os.Getenv("PARLEY_TEST_CASSANDRA")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires Cassandra: set PARLEY_TEST_CASSANDRA")
		}
		t.Skip("PARLEY_TEST_CASSANDRA not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := cassandra.Config{Hosts: []string{addr}, Keyspace: fmt.Sprintf("parley_attach_%d", time.Now().UnixNano()%1_000_000_000)}
	if err := cassandra.Migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	cs, err := cassandra.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		c := gocql.NewCluster(addr)
		c.Timeout = 30 * time.Second
		if admin, err := c.CreateSession(); err == nil {
			_ = admin.Query(`DROP KEYSPACE IF EXISTS ` + cfg.Keyspace).Exec()
			admin.Close()
		}
	})
	return cs
}

// dirHolds reports whether a file under dir has exactly data's bytes.
func dirHolds(t *testing.T, dir string, data []byte) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || found {
			return err
		}
		info, err := d.Info()
		if err != nil || info.Size() != int64(len(data)) {
			return nil //nolint:nilerr // a file that went meanwhile holds nothing
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Equal(b, data) {
			found = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// randomBytes returns n random bytes.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// plainClient makes requests the OpenAPI check does not see: the bytes of
// uploads and downloads on S3, whose answers are the S3 server's.
var plainClient = &http.Client{Timeout: time.Minute}

// abs is url as a client reaches it: Parley's own URLs are relative to the
// node's HTTP origin.
func (n *attachNode) abs(url string) string {
	if strings.HasPrefix(url, "/") {
		return n.srv.HTTPURL + url
	}
	return url
}

// client is the HTTP client of url: the validating one for Parley's own
// endpoints.
func (n *attachNode) client(url string) *http.Client {
	if strings.HasPrefix(url, "/") {
		return http.DefaultClient
	}
	return plainClient
}

// upload uploads data to conv as c and returns the complete upload.
func (n *attachNode) upload(c *rawConn, conv uint64, name, media string, data []byte) *protocol.UploadInfo {
	c.t.Helper()
	t := c.t
	up := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: conv, Size: int64(len(data)),
		SHA256: sha256Hex(data), MediaType: media, Name: name}), protocol.TypeUpload).Upload
	for part := up.Received + 1; part <= up.Parts; part++ {
		p := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeUploadPart, AttachmentID: up.AttachmentID, Part: part}), protocol.TypeUpload).Upload
		from := int64(part-1) * up.PartSize
		to := min(from+up.PartSize, int64(len(data)))
		req, err := http.NewRequest(http.MethodPut, n.abs(p.URL), bytes.NewReader(data[from:to]))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = to - from
		resp, err := plainClient.Do(req)
		if err != nil {
			t.Fatalf("PUT part %d: %v", part, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("PUT part %d: %d %s", part, resp.StatusCode, body)
		}
	}
	done := mustOK(t, c.call(protocol.Frame{Type: protocol.TypeUploadComplete, AttachmentID: up.AttachmentID}), protocol.TypeUpload).Upload
	if done.State != protocol.UploadComplete {
		t.Fatalf("upload_complete: state %q, want complete", done.State)
	}
	return done
}

func (c *rawConn) sendFile(conv uint64, cmid string, id uint64, body string) *protocol.Frame {
	c.t.Helper()
	return c.call(protocol.Frame{Type: protocol.TypeSend, ConvID: conv, ClientMsgID: cmid, Kind: protocol.KindFile, AttachmentID: id, Body: body})
}

func (c *rawConn) attachmentURL(conv, seq uint64, thumb bool) *protocol.Frame {
	c.t.Helper()
	return c.call(protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: conv, Seq: seq, Thumbnail: thumb})
}

// wantErr checks that f is an error with code, whose HTTP status is want.
func wantErr(t *testing.T, what string, f *protocol.Frame, code protocol.Code, status int) {
	t.Helper()
	if f.Type != protocol.TypeError || f.Code != code {
		t.Fatalf("%s: got %s %s (%s), want error %s", what, f.Type, f.Code, f.Error, code)
	}
	if got := protocol.HTTPStatus(code); got != status {
		t.Fatalf("%s: %s maps to HTTP %d, want %d", what, code, got, status)
	}
}

// get fetches url (with the Range header rng, if set).
func (n *attachNode) get(t *testing.T, url, rng string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, n.abs(url), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := n.client(url).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// getErr fetches url, which must answer status with code.
func (n *attachNode) getErr(t *testing.T, url string, status int, code protocol.Code) {
	t.Helper()
	resp, body := n.get(t, url, "")
	var e struct {
		Code protocol.Code `json:"code"`
	}
	_ = json.Unmarshal(body, &e)
	if resp.StatusCode != status || e.Code != code {
		t.Fatalf("GET %s: %d %s, want %d %s", url, resp.StatusCode, body, status, code)
	}
}

// TestAttachmentDownload: alice uploads a file of two parts to a group and
// sends it; bob gets the message with its attachment_id and FileBody,
// downloads the file whole and by range; the window rules answer 403 with
// the documented codes for a non-member, a member who joined after the
// message and a removed one (whose URL given before the removal stops
// working on Parley's endpoint); a recalled message's file is refused and
// deleted from the engine.
func TestAttachmentDownload(t *testing.T) {
	attachEngines(t, testAttachmentDownload)
}

func testAttachmentDownload(t *testing.T, n *attachNode) {
	alice := dialRaw(t, n.srv, "alice", "a1")
	bob := dialRaw(t, n.srv, "bob", "b1")
	carol := dialRaw(t, n.srv, "carol", "c1")
	eve := dialRaw(t, n.srv, "eve", "e1")
	g := alice.createGroup("g", "bob", "carol")
	if alice.hello.PartBytes <= 0 || alice.hello.MaxFileBytes <= 0 {
		t.Fatalf("hello: part_bytes %d, max_file_bytes %d: attachments off", alice.hello.PartBytes, alice.hello.MaxFileBytes)
	}
	data := randomBytes(int(alice.hello.PartBytes) + 300<<10) // two parts
	up := n.upload(alice, g, "report 2026.bin", "application/pdf", data)
	if up.Parts != 2 {
		t.Fatalf("upload of %d bytes in %d parts, want 2", len(data), up.Parts)
	}

	// A kind file message names the upload; the server composes its body.
	ack := mustOK(t, alice.sendFile(g, "f1", up.AttachmentID, `{"caption":"the report","duration_ms":0}`), protocol.TypeAck)
	m := msgAt(t, bob, ack.Seq)
	if m.Kind != protocol.KindFile || m.AttachmentID != up.AttachmentID {
		t.Fatalf("bob got %+v, want kind file naming %d", m, up.AttachmentID)
	}
	var fb protocol.FileBody
	if err := json.Unmarshal([]byte(m.Body), &fb); err != nil {
		t.Fatalf("body %q: %v", m.Body, err)
	}
	want := protocol.FileBody{AttachmentID: up.AttachmentID, Name: "report 2026.bin", Size: int64(len(data)),
		MediaType: "application/pdf", SHA256: sha256Hex(data), Caption: "the report"}
	if fb != want {
		t.Fatalf("file body %+v, want %+v", fb, want)
	}
	// Every read path carries attachment_id: history, sync, conv_list.
	if h := bob.history(g); h[len(h)-1].AttachmentID != up.AttachmentID {
		t.Fatalf("history's last message %+v has no attachment_id", h[len(h)-1])
	}
	snap := mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeSync, Convs: []protocol.SyncConv{{ConvID: g, AfterSeq: ack.Seq - 1}}}), protocol.TypeSnapshot)
	if len(snap.Snapshot) != 1 || len(snap.Snapshot[0].Messages) != 1 || snap.Snapshot[0].Messages[0].AttachmentID != up.AttachmentID {
		t.Fatalf("sync %+v: want the file message with its attachment_id", snap.Snapshot)
	}
	list := mustOK(t, bob.call(protocol.Frame{Type: protocol.TypeConvList}), protocol.TypeConvList)
	if lm := list.List[0].LastMessage; lm == nil || lm.AttachmentID != up.AttachmentID {
		t.Fatalf("conv_list last_message %+v has no attachment_id", lm)
	}

	// The same send again is the same message; another message cannot
	// take the file, and a file message is never edited.
	if again := mustOK(t, alice.sendFile(g, "f1", up.AttachmentID, `{"caption":"the report"}`), protocol.TypeAck); !again.Duplicate || again.Seq != ack.Seq {
		t.Fatalf("retried send: %+v, want duplicate of seq %d", again, ack.Seq)
	}
	wantErr(t, "second message of one file", alice.sendFile(g, "f2", up.AttachmentID, ""), protocol.CodeConflict, 409)
	wantErr(t, "edit of a file message", alice.call(protocol.Frame{Type: protocol.TypeEdit, ConvID: g, ClientMsgID: "e1", TargetSeq: ack.Seq, Body: "x"}), protocol.CodeConflict, 409)
	wantErr(t, "someone else's file", bob.sendFile(g, "b1", up.AttachmentID, ""), protocol.CodeNotFound, 404)

	// bob downloads it: the whole file, then a range.
	att := mustOK(t, bob.attachmentURL(g, ack.Seq, false), protocol.TypeAttachment).Attachment
	if att.AttachmentID != up.AttachmentID || att.Size != int64(len(data)) || att.SHA256 != sha256Hex(data) || att.Name != "report 2026.bin" || att.Seq != ack.Seq {
		t.Fatalf("attachment %+v does not describe the upload", att)
	}
	if n.s3 == strings.HasPrefix(att.URL, "/") {
		t.Fatalf("url %q: want a presigned S3 URL on S3, Parley's endpoint otherwise", att.URL)
	}
	resp, got := n.get(t, att.URL, "")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) || sha256Hex(got) != att.SHA256 {
		t.Fatalf("download: %d, %d bytes (want %d, hash equal %v)", resp.StatusCode, len(got), len(data), sha256Hex(got) == att.SHA256)
	}
	resp, got = n.get(t, att.URL, "bytes=1000-1999")
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, data[1000:2000]) {
		t.Fatalf("range 1000-1999: %d, %d bytes", resp.StatusCode, len(got))
	}
	if cr, want := resp.Header.Get("Content-Range"), fmt.Sprintf("bytes 1000-1999/%d", len(data)); cr != want {
		t.Fatalf("Content-Range %q, want %q", cr, want)
	}
	resp, got = n.get(t, att.URL, fmt.Sprintf("bytes=%d-", len(data)-10)) // the end, across the part boundary's far side
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, data[len(data)-10:]) {
		t.Fatalf("suffix range: %d, %d bytes", resp.StatusCode, len(got))
	}
	if resp, _ := n.get(t, att.URL, fmt.Sprintf("bytes=%d-", len(data)+5)); resp.StatusCode != http.StatusRequestedRangeNotSatisfiable {
		t.Fatalf("range beyond the file: %d, want 416", resp.StatusCode)
	}
	if !n.s3 {
		rangeThenNext(t, n.srv, att.URL, data)
	}

	// The window: a non-member, a member who joined after the message,
	// a message that is not a file, a seq beyond the last.
	wantErr(t, "non-member", eve.attachmentURL(g, ack.Seq, false), protocol.CodeNotMember, 403)
	alice.addMembers(g, "dave")
	dave := dialRaw(t, n.srv, "dave", "d1")
	wantErr(t, "joined after", dave.attachmentURL(g, ack.Seq, false), protocol.CodeForbidden, 403)
	text := mustOK(t, alice.sendText(g, "t1", "hello"), protocol.TypeAck)
	wantErr(t, "text message", bob.attachmentURL(g, text.Seq, false), protocol.CodeNotFound, 404)
	wantErr(t, "beyond last_seq", bob.attachmentURL(g, text.Seq+100, false), protocol.CodeNotFound, 404)
	wantErr(t, "thumbnail of a file that has none", bob.attachmentURL(g, ack.Seq, true), protocol.CodeNotFound, 404)

	// carol gets a URL, then is removed: attachment_url refuses her, and
	// on Parley's endpoint the URL she holds stops working at once (a
	// presigned S3 URL lasts until it expires, as documented).
	carolURL := mustOK(t, carol.attachmentURL(g, ack.Seq, false), protocol.TypeAttachment).Attachment.URL
	if resp, _ := n.get(t, carolURL, "bytes=0-0"); resp.StatusCode != http.StatusPartialContent {
		t.Fatalf("carol's URL before removal: %d", resp.StatusCode)
	}
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRemove, ConvID: g, Members: []string{"carol"}}), protocol.TypeConv)
	wantErr(t, "removed member", carol.attachmentURL(g, ack.Seq, false), protocol.CodeNotMember, 403)
	if !n.s3 {
		n.getErr(t, carolURL, http.StatusForbidden, protocol.CodeNotMember)
		// A URL whose signature does not cover what it says (another
		// user) is refused before anything is read.
		forged := strings.Replace(carolURL, "user=carol", "user=bob", 1)
		n.getErr(t, forged, http.StatusUnauthorized, protocol.CodeUnauthorized)
	}

	// alice recalls it: the message shows recalled without its file, the
	// URL bob holds stops working, and the bytes leave the engine.
	bobURL := att.URL
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: g, ClientMsgID: "r1", TargetSeq: ack.Seq}), protocol.TypeAck)
	wantErr(t, "recalled", bob.attachmentURL(g, ack.Seq, false), protocol.CodeForbidden, 403)
	for _, hm := range bob.history(g) {
		if hm.Seq == ack.Seq && (!hm.Recalled || hm.AttachmentID != 0 || hm.Body != "") {
			t.Fatalf("recalled message in history: %+v", hm)
		}
	}
	if !n.s3 {
		n.getErr(t, bobURL, http.StatusForbidden, protocol.CodeForbidden)
	}
	waitFor(t, func() bool { return !n.blobsHold(t, up.AttachmentID, data) })
	wantErr(t, "resend of a recalled file", alice.sendFile(g, "f3", up.AttachmentID, ""), protocol.CodeNotFound, 404)
}

// rangeThenNext sends a range request and then another request on one
// keep-alive connection: the range's answer ends at its Content-Length,
// and the next answer is the next request's (the event loop once sent the
// rest of the file after a range, which the client took for the next
// answer).
func rangeThenNext(t *testing.T, srv *servertest.Server, url string, data []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.HTTPURL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	host := strings.TrimPrefix(srv.HTTPURL, "http://")
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nRange: bytes=10-19\r\n\r\nGET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", url, host, host); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	first, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(first.Body)
	if err != nil || first.StatusCode != http.StatusPartialContent || !bytes.Equal(body, data[10:20]) {
		t.Fatalf("range on a kept-alive connection: %d %q %v", first.StatusCode, body, err)
	}
	second, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the answer after a range: %v", err)
	}
	body, _ = io.ReadAll(second.Body)
	if second.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Fatalf("the answer after a range: %d %q", second.StatusCode, body)
	}
}

// TestAttachmentSendRules: what a send of kind file refuses.
func TestAttachmentSendRules(t *testing.T) {
	srv := servertest.Start(t)
	n := &attachNode{srv: srv}
	alice := dialRaw(t, srv, "alice", "a1")
	bob := dialRaw(t, srv, "bob", "b1")
	d := alice.openDirect("bob")
	other := alice.openDirect("carol")
	data := []byte("hello, file")

	wantErr(t, "no such upload", alice.sendFile(d, "x1", 12345, ""), protocol.CodeNotFound, 404)
	pending := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeUploadCreate, ConvID: d, Size: int64(len(data)),
		SHA256: sha256Hex(data), MediaType: "text/plain", Name: "a.txt"}), protocol.TypeUpload).Upload
	wantErr(t, "upload not complete", alice.sendFile(d, "x2", pending.AttachmentID, ""), protocol.CodeUploadIncomplete, 409)

	up := n.upload(alice, d, "a.txt", "text/plain", data)
	wantErr(t, "another conversation", alice.sendFile(other, "x3", up.AttachmentID, ""), protocol.CodeNotFound, 404)
	wantErr(t, "another user's upload", bob.sendFile(d, "x4", up.AttachmentID, ""), protocol.CodeNotFound, 404)
	wantErr(t, "body not JSON", alice.sendFile(d, "x5", up.AttachmentID, "just text"), protocol.CodeInvalidArgument, 400)
	long := strings.Repeat("c", protocol.DefaultLimits.MaxBodyBytes-50)
	cap, _ := json.Marshal(map[string]string{"caption": long})
	wantErr(t, "body over max_body_bytes once composed", alice.sendFile(d, "x6", up.AttachmentID, string(cap)), protocol.CodeTooLarge, 413)
	// kind file without attachment_id, attachment_id on a text: refused
	// by the decoder.
	wantErr(t, "file without attachment_id", alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: d, ClientMsgID: "x7", Kind: protocol.KindFile, Body: "{}"}), protocol.CodeInvalidArgument, 400)
	wantErr(t, "text with attachment_id", alice.call(protocol.Frame{Type: protocol.TypeSend, ConvID: d, ClientMsgID: "x8", Body: "x", AttachmentID: up.AttachmentID}), protocol.CodeInvalidArgument, 400)

	// Refusals left the upload free: a valid send takes it, with no body
	// at all, and the body carries the server's fields only.
	ack := mustOK(t, alice.sendFile(d, "x9", up.AttachmentID, ""), protocol.TypeAck)
	m := msgAt(t, bob, ack.Seq)
	var fb map[string]any
	if err := json.Unmarshal([]byte(m.Body), &fb); err != nil || fb["caption"] != nil || fb["name"] != "a.txt" || fb["sha256"] != sha256Hex(data) {
		t.Fatalf("body %s (%v)", m.Body, err)
	}
	resp, got := n.get(t, mustOK(t, bob.attachmentURL(d, ack.Seq, false), protocol.TypeAttachment).Attachment.URL, "")
	if resp.StatusCode != 200 || !bytes.Equal(got, data) || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("text file: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), got)
	}
}

// TestAttachmentSafeHeaders: an uploaded HTML page and SVG image are served
// as downloads that cannot run in a page — application/octet-stream, an
// attachment disposition, nosniff and a sandboxing CSP — and the safe
// image types inline. (The real browser's check is web/browser_test.go.)
func TestAttachmentSafeHeaders(t *testing.T) {
	srv := servertest.Start(t)
	n := &attachNode{srv: srv}
	alice := dialRaw(t, srv, "alice", "a1")
	bob := dialRaw(t, srv, "bob", "b1")
	d := alice.openDirect("bob")
	for i, tc := range []struct {
		name, media, ctype, disp string
		data                     []byte
	}{
		{"page.html", "text/html", "application/octet-stream", "attachment; filename*=UTF-8''page.html",
			[]byte(`<html><script>parent.document.title="pwned"</script></html>`)},
		{"logo.svg", "image/svg+xml", "application/octet-stream", "attachment; filename*=UTF-8''logo.svg",
			[]byte(`<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><script>alert(2)</script></svg>`)},
		{"dot.png", "image/png", "image/png", "inline; filename*=UTF-8''dot.png", tinyPNG},
		{"Grüße \"1\".txt", "text/plain", "text/plain; charset=utf-8", "attachment; filename*=UTF-8''Gr%C3%BC%C3%9Fe%20%221%22.txt", []byte("hi")},
		{"voice.webm", "audio/webm;codecs=opus", "audio/webm; codecs=opus", "attachment; filename*=UTF-8''voice.webm", []byte("webm")},
	} {
		up := n.upload(alice, d, tc.name, tc.media, tc.data)
		ack := mustOK(t, alice.sendFile(d, fmt.Sprintf("h%d", i), up.AttachmentID, ""), protocol.TypeAck)
		att := mustOK(t, bob.attachmentURL(d, ack.Seq, false), protocol.TypeAttachment).Attachment
		resp, got := n.get(t, att.URL, "")
		h := resp.Header
		if resp.StatusCode != 200 || !bytes.Equal(got, tc.data) {
			t.Fatalf("%s: %d, %d bytes", tc.name, resp.StatusCode, len(got))
		}
		for k, want := range map[string]string{
			"Content-Type": tc.ctype, "Content-Disposition": tc.disp, "X-Content-Type-Options": "nosniff",
			"Content-Security-Policy": "sandbox; default-src 'none'", "Accept-Ranges": "bytes",
			"Cache-Control": fmt.Sprintf("private, max-age=%d", int(config.Default().Attach.URLTTL.Seconds())),
		} {
			if got := h.Get(k); got != want {
				t.Errorf("%s: %s %q, want %q", tc.name, k, got, want)
			}
		}
	}
}

// tinyPNG is a 1×1 PNG.
var tinyPNG = []byte{
	0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
	0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
	0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
	0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
	0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
}

// TestAttachmentAdmin: the server API lists a conversation's attachments
// and deletes one; the message stays, attachment_url then answers
// not_found, and the bytes are gone.
func TestAttachmentAdmin(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	n := &attachNode{srv: srv}
	adm := newAdmin(t, srv)
	alice := dialRaw(t, srv, "alice", "a1")
	bob := dialRaw(t, srv, "bob", "b1")
	d := alice.openDirect("bob")
	one, two := randomBytes(1000), randomBytes(2000)
	up1 := n.upload(alice, d, "one.bin", "application/octet-stream", one)
	up2 := n.upload(alice, d, "two.bin", "application/octet-stream", two)
	ack := mustOK(t, alice.sendFile(d, "f1", up1.AttachmentID, ""), protocol.TypeAck)

	type rec struct {
		AttachmentID uint64 `json:"attachment_id,string"`
		Owner        string `json:"owner"`
		Size         int64  `json:"size"`
		State        string `json:"state"`
		Seq          uint64 `json:"seq"`
		Name         string `json:"name"`
	}
	var page struct {
		Attachments []rec  `json:"attachments"`
		Next        string `json:"next"`
	}
	adm.ok(http.MethodGet, convPath(d, "/attachments?limit=1"), nil, &page)
	if len(page.Attachments) != 1 || page.Next == "" {
		t.Fatalf("first page %+v, want one record and a next", page)
	}
	first := page.Attachments[0]
	after := page.Next
	page.Attachments, page.Next = nil, ""
	adm.ok(http.MethodGet, convPath(d, "/attachments?after="+after), nil, &page)
	if len(page.Attachments) != 1 || page.Next != "" {
		t.Fatalf("second page %+v, want the other record and no next", page)
	}
	got := map[uint64]rec{first.AttachmentID: first, page.Attachments[0].AttachmentID: page.Attachments[0]}
	if r := got[up1.AttachmentID]; r.State != "attached" || r.Seq != ack.Seq || r.Owner != "alice" || r.Size != 1000 || r.Name != "one.bin" {
		t.Fatalf("sent record %+v", r)
	}
	if r := got[up2.AttachmentID]; r.State != "complete" || r.Seq != 0 {
		t.Fatalf("unsent record %+v", r)
	}
	adm.fails(http.MethodGet, convPath(999, "/attachments"), nil, http.StatusNotFound, protocol.CodeNotFound)
	adm.fails(http.MethodGet, convPath(d, "/attachments?limit=0"), nil, http.StatusBadRequest, protocol.CodeInvalidArgument)

	url := mustOK(t, bob.attachmentURL(d, ack.Seq, false), protocol.TypeAttachment).Attachment.URL
	if status, _ := adm.raw(adm.key, http.MethodDelete, "/v1/admin/attachments/"+u64(up1.AttachmentID), nil); status != http.StatusNoContent {
		t.Fatalf("delete: %d, want 204", status)
	}
	adm.fails(http.MethodDelete, "/v1/admin/attachments/"+u64(up1.AttachmentID), nil, http.StatusNotFound, protocol.CodeNotFound)
	wantErr(t, "deleted file", bob.attachmentURL(d, ack.Seq, false), protocol.CodeNotFound, 404)
	n.getErr(t, url, http.StatusNotFound, protocol.CodeNotFound)
	if h := bob.history(d); len(h) != 1 || h[0].Kind != protocol.KindFile || h[0].Recalled {
		t.Fatalf("history after the deletion: %+v, want the message as it was", h)
	}
	if dirHolds(t, srv.DataDir, one) {
		t.Fatal("the deleted file's bytes are still on disk")
	}
	page.Attachments, page.Next = nil, ""
	adm.ok(http.MethodGet, convPath(d, "/attachments"), nil, &page)
	if len(page.Attachments) != 1 || page.Attachments[0].AttachmentID != up2.AttachmentID {
		t.Fatalf("after the deletion: %+v", page.Attachments)
	}
}

// TestAttachmentModeration: the server API's moderation recall of a file
// message deletes its file as the sender's recall does; its edit is a
// conflict.
func TestAttachmentModeration(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	n := &attachNode{srv: srv}
	adm := newAdmin(t, srv)
	alice := dialRaw(t, srv, "alice", "a1")
	bob := dialRaw(t, srv, "bob", "b1")
	g := alice.createGroup("g", "bob")
	data := randomBytes(4096)
	up := n.upload(alice, g, "x.bin", "application/octet-stream", data)
	ack := mustOK(t, alice.sendFile(g, "f1", up.AttachmentID, ""), protocol.TypeAck)
	path := convPath(g, "/messages/"+u64(ack.Seq))
	adm.fails(http.MethodPatch, path, map[string]string{"client_msg_id": "e1", "body": "x"}, http.StatusConflict, protocol.CodeConflict)
	var rec ackAns
	adm.ok(http.MethodDelete, path+"?client_msg_id=r1", nil, &rec)
	wantErr(t, "recalled by moderation", bob.attachmentURL(g, ack.Seq, false), protocol.CodeForbidden, 403)
	waitFor(t, func() bool { return !dirHolds(t, srv.DataDir, data) })
	var page struct {
		Attachments []json.RawMessage `json:"attachments"`
	}
	adm.ok(http.MethodGet, convPath(g, "/attachments"), nil, &page)
	if len(page.Attachments) != 0 {
		t.Fatalf("records after the moderation recall: %s", page.Attachments)
	}
}

// TestAttachmentWebhooks: message.created of a file message carries its
// attachment_id and, in a plain conversation, the attachment's metadata;
// in an E2E conversation no attachment object and no body (the server
// never has a file's key to leak).
func TestAttachmentWebhooks(t *testing.T) {
	const secret = "attach-hook-secret"
	var (
		mu     sync.Mutex
		events []webhook.Event
	)
	recv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev, _, err := webhook.VerifyRequest(r, []byte(secret))
		if err != nil {
			t.Errorf("webhook: %v", err)
			return
		}
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}))
	srv := servertest.Start(t, servertest.WithConfig(func(c *config.Config) {
		c.Webhooks = hooks.Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Endpoints: []hooks.Endpoint{{
			Name: "bots", URL: recv, Secret: secret, Timeout: 10 * time.Second, Preview: hooks.PreviewFull,
			Events: []string{webhook.MessageCreated, webhook.RecipientOffline},
		}}}
	}))
	n := &attachNode{srv: srv}
	alice := dialRaw(t, srv, "alice", "a1")
	plain := alice.openDirect("bob")
	secure := mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: "bob", E2E: true}), protocol.TypeConv).Conv.ConvID
	img := n.upload(alice, plain, "dot.png", "image/png", tinyPNG)
	pAck := mustOK(t, alice.sendFile(plain, "p1", img.AttachmentID, `{"caption":"a dot"}`), protocol.TypeAck)
	cipher := randomBytes(800)
	enc := n.upload(alice, secure, "encrypted", "application/octet-stream", cipher)
	env := `{"e2e":1,"to":[{"user":"bob","device":"d","type":2,"body":"AAAA"}]}`
	sAck := mustOK(t, alice.sendFile(secure, "s1", enc.AttachmentID, env), protocol.TypeAck)
	wantErr(t, "E2E file without envelope", alice.sendFile(secure, "s2", enc.AttachmentID, ""), protocol.CodeE2ERequired, 400)

	byKey := func() map[string]webhook.Event {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]webhook.Event{}
		for _, e := range events {
			out[e.ID] = e
		}
		return out
	}
	pID, sID, offID := webhook.ID(plain, pAck.Seq, webhook.MessageCreated), webhook.ID(secure, sAck.Seq, webhook.MessageCreated), webhook.ID(plain, pAck.Seq, webhook.RecipientOffline)
	waitFor(t, func() bool { e := byKey(); return e[pID].ID != "" && e[sID].ID != "" && e[offID].ID != "" })
	evs := byKey()

	var pd webhook.MessageData
	if err := json.Unmarshal(evs[pID].Data, &pd); err != nil {
		t.Fatal(err)
	}
	wantAtt := webhook.Attachment{AttachmentID: img.AttachmentID, Name: "dot.png", Size: int64(len(tinyPNG)), MediaType: "image/png",
		SHA256: sha256Hex(tinyPNG), Width: img.Width, Height: img.Height}
	if pd.Message.AttachmentID != img.AttachmentID || pd.Attachment == nil || *pd.Attachment != wantAtt {
		t.Fatalf("plain message.created: %s, want attachment %+v", evs[pID].Data, wantAtt)
	}
	var off webhook.OfflineData
	if err := json.Unmarshal(evs[offID].Data, &off); err != nil {
		t.Fatal(err)
	}
	if off.Preview == nil || off.Preview.Body != "a dot" || off.Preview.File != "dot.png" || len(off.Users) != 1 || off.Users[0] != "bob" {
		t.Fatalf("recipient.offline of a file: %s", evs[offID].Data)
	}
	var sd webhook.MessageData
	if err := json.Unmarshal(evs[sID].Data, &sd); err != nil {
		t.Fatal(err)
	}
	if !sd.E2E || sd.Message.AttachmentID != enc.AttachmentID || sd.Attachment != nil || sd.Message.Body != "" {
		t.Fatalf("E2E message.created: %s, want attachment_id only", evs[sID].Data)
	}
	raw := string(evs[sID].Data)
	for _, leak := range []string{"AAAA", "encrypted", `"key"`, "attachment\":{"} {
		if strings.Contains(raw, leak) {
			t.Fatalf("E2E event carries %q: %s", leak, raw)
		}
	}
	// The author's sealed recall of an E2E file message deletes the
	// ciphertext too.
	mustOK(t, alice.call(protocol.Frame{Type: protocol.TypeRecall, ConvID: secure, ClientMsgID: "sr1", TargetSeq: sAck.Seq, Body: env}), protocol.TypeAck)
	waitFor(t, func() bool { return !dirHolds(t, srv.DataDir, cipher) })
}
