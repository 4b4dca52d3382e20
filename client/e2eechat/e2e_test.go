package e2eechat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/search"
	sbleve "github.com/parley-im/parley/internal/search/bleve"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// Acceptance tests of end-to-end encryption against a real in-process node:
// the SDK (this package) on both ends, the server in the middle.

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

type dev struct {
	c       *client.Client
	m       *Messenger
	st      *e2ee.MemoryStore
	keysLow chan client.KeysLow

	mu     sync.Mutex
	pushed map[uint64][]protocol.Message // messages from the event stream (pushes, sync)
}

func (d *dev) events(conv uint64) []protocol.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]protocol.Message(nil), d.pushed[conv]...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func startDev(t *testing.T, srv *servertest.Server, user, device string, keys int) *dev {
	t.Helper()
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: device})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	low := make(chan client.KeysLow, 64)
	d := &dev{c: c, keysLow: low, pushed: map[uint64][]protocol.Message{}}
	go func() {
		for ev := range c.Events() {
			if ev.Kind == client.EventMessage {
				d.mu.Lock()
				d.pushed[ev.ConvID] = append(d.pushed[ev.ConvID], *ev.Message)
				d.mu.Unlock()
			}
			if ev.Kind == client.EventKeysLow {
				select {
				case low <- *ev.KeysLow:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); c.Close(); <-done })
	st := e2ee.NewMemoryStore()
	edev, err := e2ee.OpenDevice(st, e2ee.Address{User: user, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	shareAccount(t, srv, edev)
	m := New(c, edev, st)
	if keys > 0 {
		if _, err := m.PublishKeys(ctxT(t), keys); err != nil {
			t.Fatalf("publish keys of %s/%s: %v", user, device, err)
		}
	}
	d.m, d.st = m, st
	return d
}

// accounts holds each test user's account key (per test, whose nodes —
// restarted, or on a copy of the data — keep their users): a user's
// devices share it, as devices linked to one account do.
var accounts sync.Map // "<test>/<user>" → exported account key

// shareAccount gives d its user's account key in the test, creating it
// for the user's first device.
func shareAccount(t *testing.T, _ *servertest.Server, d *e2ee.Device) {
	t.Helper()
	key := t.Name() + "/" + d.Address().User
	if b, ok := accounts.Load(key); ok {
		if _, err := d.ImportAccountKey(b.([]byte)); err != nil {
			t.Fatal(err)
		}
		return
	}
	if _, err := d.CreateAccountKey(); err != nil {
		t.Fatal(err)
	}
	b, err := d.ExportAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	accounts.Store(key, b)
}

// history returns every message of conv visible to d.
func (d *dev) history(t *testing.T, conv uint64) []protocol.Message {
	t.Helper()
	msgs, _, err := d.c.History(ctxT(t), conv, client.HistoryQuery{Forward: true, Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// read opens every message of conv and returns the user-visible texts by seq.
func (d *dev) read(t *testing.T, conv uint64) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	for _, msg := range d.history(t, conv) {
		o, err := d.m.Open(msg)
		if err != nil {
			out[msg.Seq] = "ERR:" + err.Error()
			continue
		}
		if (o.Kind == protocol.KindText || o.Kind == protocol.KindEdit) && !o.Control && o.System == nil {
			out[msg.Seq] = o.Text
		}
	}
	return out
}

func wantText(t *testing.T, who string, got map[uint64]string, seq uint64, want string) {
	t.Helper()
	if got[seq] != want {
		t.Fatalf("%s: seq %d = %q, want %q (all: %v)", who, seq, got[seq], want, got)
	}
}

const canary = "CANARY-7f3a9c-plaintext-must-never-reach-the-server"

// control is sent in clear in a plaintext conversation: the scan must find
// it, or it could not find the canary either (compression, a wrong dir).
const control = "CONTROL-5e1d0b-plaintext-in-a-plaintext-conversation"

func TestE2EDirectConversation(t *testing.T) {
	logs := &syncBuf{}
	srv := servertest.Start(t, servertest.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	aliceLaptop := startDev(t, srv, "alice", "laptop", 5)
	bob := startDev(t, srv, "bob", "phone", 5)

	conv, err := alice.c.OpenDirectE2E(ctx, "bob")
	if err != nil || !conv.E2E {
		t.Fatalf("open E2E direct: %+v %v", conv, err)
	}
	plainConv, err := alice.c.OpenDirect(ctx, "bob")
	if err != nil || plainConv.E2E || plainConv.ConvID == conv.ConvID {
		t.Fatalf("plaintext direct %+v %v", plainConv, err)
	}
	a1, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", canary+" one")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := bob.m.SendDirect(ctx, conv.ConvID, "alice", canary+" reply")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", canary+" two")
	if err != nil {
		t.Fatal(err)
	}
	got := bob.read(t, conv.ConvID)
	wantText(t, "bob", got, a1.Seq, canary+" one")
	wantText(t, "bob", got, a2.Seq, canary+" two")
	// The sender's other device reads the sender's messages, and the peer's.
	got = aliceLaptop.read(t, conv.ConvID)
	wantText(t, "alice's laptop", got, a1.Seq, canary+" one")
	wantText(t, "alice's laptop", got, b1.Seq, canary+" reply")
	wantText(t, "alice's laptop", got, a2.Seq, canary+" two")
	// Opening again (a re-delivered push) gives the kept copy.
	wantText(t, "bob again", bob.read(t, conv.ConvID), a1.Seq, canary+" one")

	// The server refuses plaintext and mentions here.
	_, err = alice.c.Send(ctx, conv.ConvID, canary+" in clear")
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != protocol.CodeE2ERequired {
		t.Fatalf("plaintext send: %v", err)
	}
	_, err = alice.c.SendFrame(ctx, protocol.Frame{Type: protocol.TypeSend, ConvID: conv.ConvID,
		Body: protocol.EncodeEnvelope(protocol.Envelope{Group: []byte{1}}), Mentions: []string{"bob"}})
	if !errors.As(err, &ce) || ce.Code != protocol.CodeE2EUnsupported {
		t.Fatalf("mention: %v", err)
	}
	// A plaintext conversation of the same pair still takes plaintext.
	if _, err := alice.c.Send(ctx, plainConv.ConvID, control); err != nil {
		t.Fatal(err)
	}

	// Edit (a new ciphertext) and recall.
	ed, err := alice.m.EditDirect(ctx, conv.ConvID, a2.Seq, "bob", canary+" two, edited")
	if err != nil {
		t.Fatal(err)
	}
	got = bob.read(t, conv.ConvID)
	wantText(t, "bob after edit", got, ed.Seq, canary+" two, edited")
	// The edit event (a later seq) updates the kept copy of its target.
	wantText(t, "bob's edited target", bob.read(t, conv.ConvID), a2.Seq, canary+" two, edited")
	if _, err := alice.c.Recall(ctx, conv.ConvID, a1.Seq); err != nil {
		t.Fatal(err)
	}
	for _, m := range bob.history(t, conv.ConvID) {
		if m.Seq == a1.Seq && (!m.Recalled || m.Body != "") {
			t.Fatalf("recalled message: %+v", m)
		}
	}

	// A device registered later gets what is sent after it registered, and
	// nothing before.
	bobTablet := startDev(t, srv, "bob", "tablet", 5)
	a3, err := alice.m.SendDirect(ctx, conv.ConvID, "bob", canary+" three")
	if err != nil {
		t.Fatal(err)
	}
	got = bobTablet.read(t, conv.ConvID)
	wantText(t, "bob's tablet", got, a3.Seq, canary+" three")
	if !strings.HasPrefix(got[b1.Seq], "ERR:") {
		t.Fatalf("the new device read a message from before it registered: %q", got[b1.Seq])
	}
	// The device_added event reached the conversation (contacts learn of it).
	sawAdded := false
	for _, m := range alice.history(t, conv.ConvID) {
		if m.Kind == protocol.KindSystem && strings.Contains(m.Body, `"device_added"`) && strings.Contains(m.Body, `"tablet"`) {
			sawAdded = true
		}
	}
	if !sawAdded {
		t.Fatal("no device_added event for bob's tablet")
	}
	// The conversation list says which conversations are E2E.
	list, err := bob.c.Conversations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if (s.ConvID == conv.ConvID) != s.E2E {
			t.Fatalf("conv_list entry %+v", s)
		}
	}
	// Local search finds decrypted messages; safety numbers agree.
	hits, err := bob.m.Search("EDITED")
	if err != nil || len(hits) == 0 {
		t.Fatalf("search: %v %v", hits, err)
	}
	sa, err := alice.m.SafetyNumber(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := bob.m.SafetyNumber(ctx, "alice")
	if err != nil || sa != sb || len(sa) != 60 {
		t.Fatalf("safety numbers %q %q %v", sa, sb, err)
	}
	// One safety number per pair of users: alice's laptop shows the same.
	if sl, err := aliceLaptop.m.SafetyNumber(ctx, "bob"); err != nil || sl != sa {
		t.Fatalf("safety number from alice's laptop %q, want %q (%v)", sl, sa, err)
	}

	// The search index holds the plain conversation's text, nothing of the
	// E2E one's (its files are in the scan below too).
	waitIndexed(t, srv, plainConv.ConvID)

	// No plaintext anywhere on the server: data directory, logs.
	srv.Close()
	assertNoCanary(t, srv.DataDir, logs.String())
	if !dirContains(t, srv.DataDir, []byte(control)) {
		t.Fatal("the control plaintext is not found in the data directory: the scan cannot see plaintext")
	}
	assertIndexClean(t, srv.DataDir, conv.ConvID, plainConv.ConvID)
}

// waitIndexed waits until the node's search index has caught up with
// conv.
func waitIndexed(t *testing.T, srv *servertest.Server, conv uint64) {
	t.Helper()
	ix, x := srv.Search()
	if ix == nil {
		t.Fatal("no search index on the node")
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if w, err := x.Watermark(context.Background(), conv); err == nil && w > 0 && ix.Pending() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the search index did not catch up")
		}
	}
}

// assertIndexClean opens the stopped node's search index: it finds the
// control text of the plain conversation (it can see plaintext) and
// holds no document of the E2E one, nor anything with the canary.
func assertIndexClean(t *testing.T, dataDir string, e2eConv, plainConv uint64) {
	t.Helper()
	x, err := sbleve.Open(filepath.Join(dataDir, "search"))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	ctx := context.Background()
	ws := []search.Window{{ConvID: e2eConv, From: 1}, {ConvID: plainConv, From: 1}}
	q := func(text string) int {
		r, err := x.Search(ctx, search.Query{Text: text, Windows: ws, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(r.Hits)
	}
	if q(control) == 0 {
		t.Fatal("the search index does not find the control plaintext: the check cannot see it")
	}
	if n := q("CANARY-7f3a9c"); n != 0 {
		t.Fatalf("the search index finds the E2E canary (%d hits)", n)
	}
	if n, err := x.Count(ctx, e2eConv); err != nil || n != 0 {
		t.Fatalf("the search index holds %d documents of the E2E conversation (%v)", n, err)
	}
}

func dirContains(t *testing.T, dir string, needle []byte) bool {
	found := false
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, needle) {
				found = true
			}
		}
		return nil
	})
	return found
}

func assertNoCanary(t *testing.T, dir, logs string) {
	t.Helper()
	needle := []byte("CANARY-7f3a9c")
	files := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		if bytes.Contains(b, needle) {
			return fmt.Errorf("plaintext canary in %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("the data directory is empty: the check would prove nothing")
	}
	if strings.Contains(logs, string(needle)) {
		t.Fatal("plaintext canary in the server's logs")
	}
	if !strings.Contains(logs, "level=") {
		t.Fatal("no server logs captured: the check would prove nothing")
	}
}
