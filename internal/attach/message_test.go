package attach_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/blob/disk"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// The message and download side of the service on real engines (Pebble on
// disk, the disk blob engine): a record made complete the way an upload
// leaves it, a file message stored through the store as chat stores it,
// and the download endpoint served by httptest.

type counter struct{ n atomic.Uint64 }

func (c *counter) Next() uint64 { return 1000 + c.n.Add(1) }

type rig struct {
	t    *testing.T
	st   store.Store
	att  store.Attachments
	bs   blob.Store
	svc  *attach.Service
	http *httptest.Server
	now  atomic.Int64 // unix ms
	ids  counter
	conv store.Conversation
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := pebble.Open(ctx, pebble.Config{Dir: dir + "/db"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	bs, err := disk.Open(dir + "/blobs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bs.Close() })
	key, err := attach.LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := attach.DefaultConfig()
	cfg.Key = key
	r := &rig{t: t, st: st, att: st.(store.Attachments), bs: bs}
	r.now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMilli())
	svc, err := attach.New(cfg, st, bs, &r.ids, nil, func() time.Time { return time.UnixMilli(r.now.Load()) })
	if err != nil {
		t.Fatal(err)
	}
	r.svc = svc
	mux := http.NewServeMux()
	mux.Handle("GET "+attach.ContentPath+"{id}", svc.ContentHandler())
	r.http = httptest.NewServer(mux)
	t.Cleanup(r.http.Close)
	r.conv = store.Conversation{ID: 77, Kind: store.Group, Name: "g", CreatedAt: 1, Members: 3}
	members := []store.Member{
		{ConvID: 77, UserID: "alice", Role: store.RoleOwner, JoinSeq: 1},
		{ConvID: 77, UserID: "bob", Role: store.RoleMember, JoinSeq: 1},
		{ConvID: 77, UserID: "carol", Role: store.RoleMember, JoinSeq: 1},
	}
	if err := st.CreateConversation(ctx, r.conv, members); err != nil {
		t.Fatal(err)
	}
	return r
}

// file stores a complete record of owner with data, as upload_complete
// leaves one.
func (r *rig) file(owner, name, media string, data []byte) store.Attachment {
	r.t.Helper()
	ctx := context.Background()
	a := store.Attachment{ID: r.ids.Next(), Owner: owner, Device: "d", ConvID: r.conv.ID, Size: int64(len(data)),
		SHA256: sha256.Sum256(data), MediaType: media, Name: name, State: store.AttachUploading,
		CreatedAt: r.now.Load(), ExpiresAt: r.now.Load() + 3600_000, PartSize: 8 << 20}
	if err := r.att.CreateAttachment(ctx, a, 1<<40, 100); err != nil {
		r.t.Fatal(err)
	}
	if err := r.bs.Put(ctx, attach.FileKey(a.ID), bytes.NewReader(data), a.Size, a.SHA256); err != nil {
		r.t.Fatal(err)
	}
	done := a
	done.State, done.Received = store.AttachComplete, 1
	if err := r.att.UpdateAttachment(ctx, done, a); err != nil {
		r.t.Fatal(err)
	}
	return done
}

// send stores a file message as chat's send does: Attach, Append, Stored.
func (r *rig) send(user, cmid string, id uint64, body string) (store.Message, *protocol.Error) {
	r.t.Helper()
	ctx := context.Background()
	f := &protocol.Frame{Type: protocol.TypeSend, ConvID: r.conv.ID, ClientMsgID: cmid, Kind: protocol.KindFile, AttachmentID: id, Body: body}
	stored, aid, perr := r.svc.Attach(ctx, user, r.conv, f, protocol.DefaultLimits.MaxBodyBytes)
	if perr != nil {
		return store.Message{}, perr
	}
	res, err := r.st.Append(ctx, store.Append{Msg: store.Message{ConvID: r.conv.ID, MsgID: r.ids.Next(), Sender: user, SenderDevice: "d",
		ClientMsgID: cmid, Kind: protocol.KindFile, Body: stored, ServerTime: r.now.Load(), Attachment: aid}})
	if err != nil {
		r.t.Fatal(err)
	}
	r.svc.Stored(ctx, aid, res.Msg.Seq)
	return res.Msg, nil
}

func (r *rig) url(user string, seq uint64, thumb bool) (*protocol.AttachmentInfo, *protocol.Error) {
	f, perr := r.svc.Handle(context.Background(), protocol.Caller{User: user, Device: "d"},
		&protocol.Frame{Type: protocol.TypeAttachmentURL, ConvID: r.conv.ID, Seq: seq, Thumbnail: thumb})
	if perr != nil {
		return nil, perr
	}
	return f.Attachment, nil
}

func (r *rig) get(url, rng string) (*http.Response, []byte) {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.http.URL+url, nil)
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func code(perr *protocol.Error) protocol.Code {
	if perr == nil {
		return ""
	}
	return perr.Code
}

func TestAttachSendRules(t *testing.T) {
	r := newRig(t)
	data := []byte("some bytes")
	a := r.file("alice", "a.txt", "text/plain", data)
	for _, tc := range []struct {
		name       string
		user, cmid string
		id         uint64
		body       string
		want       protocol.Code
	}{
		{"no such record", "alice", "c1", 999999, "", protocol.CodeNotFound},
		{"another user's", "bob", "c1", a.ID, "", protocol.CodeNotFound},
		{"not JSON", "alice", "c1", a.ID, "hi", protocol.CodeInvalidArgument},
		{"negative duration", "alice", "c1", a.ID, `{"duration_ms":-1}`, protocol.CodeInvalidArgument},
		{"body over the limit once composed", "alice", "c1", a.ID, `{"caption":"` + strings.Repeat("x", protocol.DefaultLimits.MaxBodyBytes) + `"}`, protocol.CodeTooLarge},
	} {
		if _, perr := r.send(tc.user, tc.cmid, tc.id, tc.body); code(perr) != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, perr, tc.want)
		}
	}
	m, perr := r.send("alice", "c1", a.ID, `{"caption":"hi","width":5,"height":6,"duration_ms":1500,"name":"lie.exe","size":1}`)
	if perr != nil {
		t.Fatal(perr)
	}
	var fb protocol.FileBody
	if err := json.Unmarshal([]byte(m.Body), &fb); err != nil {
		t.Fatal(err)
	}
	want := protocol.FileBody{AttachmentID: a.ID, Name: "a.txt", Size: int64(len(data)), MediaType: "text/plain",
		SHA256: hex.EncodeToString(a.SHA256[:]), Width: 5, Height: 6, DurationMS: 1500, Caption: "hi"}
	if fb != want {
		t.Fatalf("body %+v, want %+v", fb, want)
	}
	if m.Attachment != a.ID {
		t.Fatalf("message names %d, want %d", m.Attachment, a.ID)
	}
	got, err := r.att.Attachment(context.Background(), a.ID)
	if err != nil || got.State != store.AttachAttached || got.RefClientMsgID != "c1" || got.RefSeq != m.Seq || got.ExpiresAt != 0 {
		t.Fatalf("record after the send: %+v %v", got, err)
	}
	// The same send again (a retry) is allowed; another is a conflict.
	if _, _, perr := r.svc.Attach(context.Background(), "alice", r.conv, &protocol.Frame{ClientMsgID: "c1", AttachmentID: a.ID, Kind: protocol.KindFile}, 1<<20); perr != nil {
		t.Fatalf("retry: %v", perr)
	}
	if _, perr := r.send("alice", "c2", a.ID, ""); code(perr) != protocol.CodeConflict {
		t.Fatalf("second message: %v, want conflict", perr)
	}
	// An upload not complete.
	up := store.Attachment{ID: r.ids.Next(), Owner: "alice", ConvID: r.conv.ID, Size: 5, MediaType: "text/plain", Name: "u",
		State: store.AttachUploading, CreatedAt: 1, ExpiresAt: r.now.Load() + 1000, PartSize: 8 << 20}
	if err := r.att.CreateAttachment(context.Background(), up, 1<<40, 100); err != nil {
		t.Fatal(err)
	}
	if _, perr := r.send("alice", "c3", up.ID, ""); code(perr) != protocol.CodeUploadIncomplete {
		t.Fatalf("uploading: %v, want upload_incomplete", perr)
	}
	// An E2E conversation's body is stored as sent.
	r.conv.E2E = true
	b := r.file("alice", "encrypted", "application/octet-stream", []byte("ciphertext"))
	env := `{"e2e":1,"to":[{"user":"bob","device":"d","type":2,"body":"AAAA"}]}`
	body, _, perr := r.svc.Attach(context.Background(), "alice", r.conv, &protocol.Frame{ClientMsgID: "e1", AttachmentID: b.ID, Kind: protocol.KindFile, Body: env}, 1<<20)
	if perr != nil || body != env {
		t.Fatalf("E2E: body %q %v, want the envelope as sent", body, perr)
	}
}

func TestAttachDownloadWindow(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	data := make([]byte, 300<<10)
	_, _ = rand.Read(data)
	a := r.file("alice", "clip.ogg", "audio/ogg", data)
	m, perr := r.send("alice", "c1", a.ID, "")
	if perr != nil {
		t.Fatal(perr)
	}
	info, perr := r.url("bob", m.Seq, false)
	if perr != nil {
		t.Fatal(perr)
	}
	if info.Size != int64(len(data)) || info.Name != "clip.ogg" || !strings.HasPrefix(info.URL, attach.ContentPath) ||
		info.URLExpiresAt != r.now.Load()+attach.DefaultConfig().URLTTL.Milliseconds() {
		t.Fatalf("info %+v", info)
	}
	resp, got := r.get(info.URL, "")
	if resp.StatusCode != 200 || !bytes.Equal(got, data) || resp.Header.Get("Content-Type") != "audio/ogg" ||
		resp.Header.Get("ETag") != `"`+hex.EncodeToString(a.SHA256[:])+`"` {
		t.Fatalf("GET: %d %d bytes %v", resp.StatusCode, len(got), resp.Header)
	}
	resp, got = r.get(info.URL, "bytes=100000-100009")
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, data[100000:100010]) {
		t.Fatalf("range: %d %q", resp.StatusCode, got)
	}
	resp, got = r.get(info.URL, "bytes=0-1,5-6") // several: answered as multipart/byteranges
	if resp.StatusCode != http.StatusPartialContent || !strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/byteranges") || !bytes.Contains(got, data[5:7]) {
		t.Fatalf("two ranges: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp, _ := r.get(info.URL, fmt.Sprintf("bytes=%d-", len(data))); resp.StatusCode != http.StatusRequestedRangeNotSatisfiable {
		t.Fatalf("range past the end: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, r.http.URL+info.URL, nil)
	req.Header.Set("If-None-Match", resp.Header.Get("ETag"))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotModified {
		t.Fatalf("If-None-Match: %v %v", resp, err)
	}

	// Tampered and expired URLs.
	for _, bad := range []string{
		strings.Replace(info.URL, "user=bob", "user=carol", 1),
		strings.Replace(info.URL, fmt.Sprintf("seq=%d", m.Seq), fmt.Sprintf("seq=%d", m.Seq+1), 1),
		strings.Replace(info.URL, "sig=", "sig=x", 1),
		strings.Replace(info.URL, "?", "?thumbnail=1&", 1),
		info.URL[:strings.Index(info.URL, "&sig=")],
	} {
		if resp, b := r.get(bad, ""); resp.StatusCode != 401 || !strings.Contains(string(b), `"unauthorized"`) {
			t.Errorf("%s: %d %s, want 401 unauthorized", bad, resp.StatusCode, b)
		}
	}
	r.now.Add(attach.DefaultConfig().URLTTL.Milliseconds() + 1)
	if resp, b := r.get(info.URL, ""); resp.StatusCode != 401 || !strings.Contains(string(b), "expired") {
		t.Fatalf("expired: %d %s", resp.StatusCode, b)
	}
	info, _ = r.url("bob", m.Seq, false)

	// Window rules, by attachment_url and again on the endpoint.
	if _, perr := r.url("mallory", m.Seq, false); code(perr) != protocol.CodeNotMember {
		t.Fatalf("non-member: %v", perr)
	}
	if _, perr := r.url("bob", m.Seq, true); code(perr) != protocol.CodeNotFound {
		t.Fatalf("thumbnail of audio: %v", perr)
	}
	if _, err := r.st.AddMembers(ctx, r.conv.ID, []string{"dave"}, store.RoleMember); err != nil {
		t.Fatal(err)
	}
	if _, perr := r.url("dave", m.Seq, false); code(perr) != protocol.CodeForbidden {
		t.Fatalf("joined after: %v", perr)
	}
	carol, perr := r.url("carol", m.Seq, false)
	if perr != nil {
		t.Fatal(perr)
	}
	if _, err := r.st.RemoveMembers(ctx, r.conv.ID, []string{"carol"}); err != nil {
		t.Fatal(err)
	}
	if _, perr := r.url("carol", m.Seq, false); code(perr) != protocol.CodeNotMember {
		t.Fatalf("removed: %v", perr)
	}
	if resp, b := r.get(carol.URL, ""); resp.StatusCode != 403 || !strings.Contains(string(b), `"not_member"`) {
		t.Fatalf("removed member's URL: %d %s", resp.StatusCode, b)
	}

	// Recall: the store rewrites the target as chat's check does, then
	// Recalled deletes the file.
	if _, err := r.st.Append(ctx, store.Append{Msg: store.Message{ConvID: r.conv.ID, MsgID: r.ids.Next(), Sender: "alice", ClientMsgID: "r1",
		Kind: protocol.KindRecall, TargetSeq: m.Seq, ServerTime: r.now.Load()},
		Check: func(t store.Message) (store.Message, error) {
			t.Recalled, t.Body, t.Attachment = true, "", 0
			return t, nil
		}}); err != nil {
		t.Fatal(err)
	}
	if _, perr := r.url("bob", m.Seq, false); code(perr) != protocol.CodeForbidden {
		t.Fatalf("recalled: %v", perr)
	}
	r.svc.Recalled(ctx, a.ID)
	if _, err := r.bs.Stat(ctx, attach.FileKey(a.ID)); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("recalled file's blob: %v, want not found", err)
	}
	if _, err := r.att.Attachment(ctx, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("recalled file's record: %v, want not found", err)
	}
	if u, err := r.att.AttachmentUsage(ctx, "alice"); err != nil || u.Bytes != 0 {
		t.Fatalf("usage after the recall: %+v %v", u, err)
	}
	if resp, b := r.get(info.URL, ""); resp.StatusCode != 403 || !strings.Contains(string(b), `"forbidden"`) {
		t.Fatalf("recalled file's URL: %d %s", resp.StatusCode, b)
	}
}

func TestAttachThumbnailStates(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	a := r.file("alice", "p.png", "image/png", []byte("png bytes"))
	pending := a
	pending.Thumb, pending.Width, pending.Height = store.ThumbPending, 640, 480
	if err := r.att.UpdateAttachment(ctx, pending, a); err != nil {
		t.Fatal(err)
	}
	m, perr := r.send("alice", "c1", a.ID, `{"width":1,"height":1}`)
	if perr != nil {
		t.Fatal(perr)
	}
	var fb protocol.FileBody
	_ = json.Unmarshal([]byte(m.Body), &fb)
	if fb.Width != 640 || fb.Height != 480 || fb.Thumbnail != protocol.ThumbPending {
		t.Fatalf("body %+v: the server's dimensions and a pending thumbnail", fb)
	}
	_, perr = r.url("bob", m.Seq, true)
	if code(perr) != protocol.CodeNotReady || perr.RetryAfter != 500 || !perr.Code.Retryable() {
		t.Fatalf("pending thumbnail: %+v", perr)
	}
	cur, _ := r.att.Attachment(ctx, a.ID)
	ready := cur
	ready.Thumb = store.ThumbReady
	if err := r.att.UpdateAttachment(ctx, ready, cur); err != nil {
		t.Fatal(err)
	}
	thumb := []byte("jpeg thumb")
	if err := r.bs.Put(ctx, attach.ThumbKey(a.ID), bytes.NewReader(thumb), int64(len(thumb)), sha256.Sum256(thumb)); err != nil {
		t.Fatal(err)
	}
	info, perr := r.url("bob", m.Seq, true)
	if perr != nil || info.Thumbnail != protocol.ThumbReady {
		t.Fatalf("ready thumbnail: %+v %v", info, perr)
	}
	resp, got := r.get(info.URL, "")
	if resp.StatusCode != 200 || !bytes.Equal(got, thumb) || resp.Header.Get("Content-Type") != "image/jpeg" || resp.Header.Get("Content-Disposition") != "inline" {
		t.Fatalf("thumbnail GET: %d %v", resp.StatusCode, resp.Header)
	}
	// The file's URL and the thumbnail's are signed apart.
	file, _ := r.url("bob", m.Seq, false)
	if resp, got := r.get(file.URL, ""); resp.StatusCode != 200 || !bytes.Equal(got, []byte("png bytes")) ||
		resp.Header.Get("Content-Disposition") != "inline; filename*=UTF-8''p.png" {
		t.Fatalf("file GET: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestAttachAdmin(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var ids []uint64
	for i := range 5 {
		ids = append(ids, r.file("alice", fmt.Sprintf("f%d", i), "text/plain", []byte{byte(i)}).ID)
	}
	m, _ := r.send("alice", "c1", ids[1], "")
	list, more, perr := r.svc.AdminAttachments(ctx, r.conv.ID, 0, 3)
	if perr != nil || len(list) != 3 || !more || list[1].AttachmentID != ids[1] || list[1].State != "attached" || list[1].Seq != m.Seq || list[0].State != "complete" {
		t.Fatalf("page 1: %+v %v %v", list, more, perr)
	}
	list, more, perr = r.svc.AdminAttachments(ctx, r.conv.ID, list[2].AttachmentID, 3)
	if perr != nil || len(list) != 2 || more {
		t.Fatalf("page 2: %+v %v %v", list, more, perr)
	}
	if _, _, perr := r.svc.AdminAttachments(ctx, 12345, 0, 3); code(perr) != protocol.CodeNotFound {
		t.Fatalf("no such conversation: %v", perr)
	}
	if perr := r.svc.AdminDeleteAttachment(ctx, ids[1]); perr != nil {
		t.Fatal(perr)
	}
	if perr := r.svc.AdminDeleteAttachment(ctx, ids[1]); code(perr) != protocol.CodeNotFound {
		t.Fatalf("second delete: %v", perr)
	}
	if _, perr := r.url("bob", m.Seq, false); code(perr) != protocol.CodeNotFound {
		t.Fatalf("deleted file: %v, want not_found", perr)
	}
	if _, err := r.bs.Stat(ctx, attach.FileKey(ids[1])); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("deleted blob: %v", err)
	}
}
