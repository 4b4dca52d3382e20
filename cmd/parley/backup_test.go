package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

func startClient(t *testing.T, ctx context.Context, srv *servertest.Server, user string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{URL: srv.URL, Token: srv.Token(user), Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	go func() {
		for range c.Events() {
		}
	}()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// history reads every message of conv from seq 1 on.
func history(t *testing.T, ctx context.Context, c *client.Client, conv uint64) []protocol.Message {
	t.Helper()
	var all []protocol.Message
	for {
		after := uint64(0)
		if len(all) > 0 {
			after = all[len(all)-1].Seq
		}
		page, _, err := c.History(ctx, conv, client.HistoryQuery{Forward: true, AfterSeq: after, Limit: 200})
		if err != nil {
			t.Fatalf("history: %v", err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
	}
}

// TestBackupWhileServingRestores: `parley backup` takes an archive from a
// node while two senders keep writing to a direct conversation and a group;
// `parley restore` unpacks it; a node started on the copy holds, for each
// conversation, a dense prefix of the original's messages (every message
// acknowledged before the backup began, identical), with members, read
// positions and the sequence continuing from the copy's last seq.
func TestBackupWhileServingRestores(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	srv := servertest.Start(t, servertest.WithAdmin(), servertest.WithKey(key))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice, bob := startClient(t, ctx, srv, "alice"), startClient(t, ctx, srv, "bob")
	direct, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	group, err := alice.CreateGroup(ctx, "team", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	var acked [2]atomic.Uint64
	send := func(c *client.Client, conv uint64, slot int, n int) error {
		for i := 0; i < n; i++ {
			ack, err := c.Send(ctx, conv, fmt.Sprintf("m%d-%d", slot, i))
			if err != nil {
				return err
			}
			acked[slot].Store(ack.Seq)
		}
		return nil
	}
	if err := send(alice, direct.ConvID, 0, 20); err != nil {
		t.Fatal(err)
	}
	if err := send(bob, group.ConvID, 1, 20); err != nil {
		t.Fatal(err)
	}
	if err := bob.MarkRead(ctx, direct.ConvID, 10); err != nil {
		t.Fatal(err)
	}
	// An attachment: its file is in the archive too.
	file := bytes.Repeat([]byte("parley backup "), 5000)
	up, err := alice.Upload(ctx, direct.ConvID, bytes.NewReader(file), int64(len(file)), client.UploadOptions{Name: "f.txt", MediaType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	fileAck, err := alice.SendFile(ctx, direct.ConvID, up.AttachmentID, client.FileMessage{})
	if err != nil {
		t.Fatal(err)
	}

	// Senders keep going through the backup.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for slot, c := range []*client.Client{alice, bob} {
		conv := []uint64{direct.ConvID, group.ConvID}[slot]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := send(c, conv, slot, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	before := [2]uint64{acked[0].Load(), acked[1].Load()}
	dir := t.TempDir()
	archive := filepath.Join(dir, "backup.tar")
	var msg bytes.Buffer
	adminArgs := []string{"--admin.listen", strings.TrimPrefix(srv.AdminURL, "http://"), "--admin.key", srv.AdminKey}
	if err := runBackup(ctx, append(adminArgs, "-out", archive), &msg); err != nil {
		t.Fatalf("backup: %v", err)
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("a send failed during the backup: %v", err)
	default:
	}
	if !strings.Contains(msg.String(), "written to "+archive) {
		t.Errorf("backup said %q", msg.String())
	}
	// A second backup into a name that exists replaces it whole.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("backup left %d entries in its directory: %v", len(entries), entries)
	}

	restored := filepath.Join(dir, "restored")
	msg.Reset()
	if err := runRestore([]string{"-from", archive, "-data-dir", restored}, &msg); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if err := runRestore([]string{"-from", archive, "-data-dir", restored}, &msg); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("restore over a restored directory = %v, want a refusal", err)
	}
	for _, sub := range []string{"store", "ledger"} {
		if st, err := os.Stat(filepath.Join(restored, sub)); err != nil || !st.IsDir() {
			t.Fatalf("restored %s: %v", sub, err)
		}
	}

	copySrv := servertest.Start(t, servertest.WithDataDir(restored), servertest.WithKey(key), servertest.WithNode("restored"))
	ra, rb := startClient(t, ctx, copySrv, "alice"), startClient(t, ctx, copySrv, "bob")
	for slot, conv := range []uint64{direct.ConvID, group.ConvID} {
		orig := history(t, ctx, alice, conv)
		got := history(t, ctx, ra, conv)
		if len(got) == 0 || got[len(got)-1].Seq < before[slot] {
			t.Fatalf("conv %d: the copy ends at %d messages; %d were acknowledged before the backup", conv, len(got), before[slot])
		}
		for i, m := range got {
			if m.Seq != uint64(i+1) {
				t.Fatalf("conv %d: the copy's message %d has seq %d: not dense", conv, i, m.Seq)
			}
			if i >= len(orig) || orig[i].Body != m.Body || orig[i].Sender != m.Sender || orig[i].MsgID != m.MsgID {
				t.Fatalf("conv %d seq %d: copy %q/%s, original %v", conv, m.Seq, m.Body, m.Sender, orig[i])
			}
		}
		// The sequence continues from the copy's last seq.
		ack, err := ra.Send(ctx, conv, "after the restore")
		if err != nil || ack.Seq != got[len(got)-1].Seq+1 {
			t.Fatalf("conv %d: send on the copy = %+v, %v; last seq %d", conv, ack, err, got[len(got)-1].Seq)
		}
	}
	t.Logf("acknowledged before the backup: %v; in the copy: direct %d, group %d; by the end: %d, %d",
		before, len(history(t, ctx, ra, direct.ConvID))-1, len(history(t, ctx, ra, group.ConvID))-1, acked[0].Load(), acked[1].Load())
	var got bytes.Buffer
	if _, _, err := rb.Download(ctx, direct.ConvID, fileAck.Seq, &got, client.DownloadOptions{}); err != nil || !bytes.Equal(got.Bytes(), file) {
		t.Fatalf("the attachment on the copy: %d bytes, %v", got.Len(), err)
	}
	convs, err := rb.Conversations(ctx)
	if err != nil || len(convs) != 2 {
		t.Fatalf("bob's conversations on the copy: %+v, %v", convs, err)
	}
	for _, c := range convs {
		if c.ConvID == direct.ConvID && c.ReadSeq < 10 {
			t.Errorf("bob's read position in the direct conversation: %d, want >= 10", c.ReadSeq)
		}
	}
	carol := startClient(t, ctx, copySrv, "carol")
	if cc, err := carol.Conversations(ctx); err != nil || len(cc) != 1 || cc[0].ConvID != group.ConvID || cc[0].Unread == 0 {
		t.Fatalf("carol's conversations on the copy: %+v, %v", cc, err)
	}
}

// TestBackupRefusals: a cut archive is refused by restore (and leaves no
// directory), a cluster or API-less configuration is refused by backup,
// and a second backup while one runs answers conflict.
func TestBackupRefusals(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	ctx := context.Background()
	dir := t.TempDir()
	archive := filepath.Join(dir, "b.tar")
	adminArgs := []string{"--admin.listen", strings.TrimPrefix(srv.AdminURL, "http://"), "--admin.key", srv.AdminKey}
	if err := runBackup(ctx, append(adminArgs, "-out", archive), &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	whole, _ := os.ReadFile(archive)
	cut := filepath.Join(dir, "cut.tar")
	_ = os.WriteFile(cut, whole[:len(whole)/2], 0o600)
	target := filepath.Join(dir, "r")
	if err := runRestore([]string{"-from", cut, "-data-dir", target}, &bytes.Buffer{}); err == nil {
		t.Fatal("restore of a cut archive succeeded")
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("a failed restore left %s (%v)", target, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".r.restore-*")); len(left) != 0 {
		t.Fatalf("a failed restore left %v", left)
	}
	// A name that escapes the directory is refused.
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	for _, e := range []struct{ name, body string }{{server.BackupManifest, `{"format":1}`}, {"../escape", "x"}} {
		_ = tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.body)), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(e.body))
	}
	_ = tw.Close()
	evilFile := filepath.Join(dir, "evil.tar")
	_ = os.WriteFile(evilFile, evil.Bytes(), 0o600)
	if err := runRestore([]string{"-from", evilFile, "-data-dir", target}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "unsafe name") {
		t.Fatalf("restore of ../escape = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "escape")); !os.IsNotExist(err) {
		t.Fatal("restore wrote outside its directory")
	}
	// No server API configured.
	if err := runBackup(ctx, []string{"-out", archive}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "server API is off") {
		t.Fatalf("backup without admin.listen = %v", err)
	}
	// A wrong key.
	bad := append([]string{}, adminArgs...)
	bad[3] = hex.EncodeToString(make([]byte, 32))
	if err := runBackup(ctx, append(bad, "-out", archive), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("backup with a wrong key = %v", err)
	}
	// One at a time.
	if err := srv.Backup(ctx, blockingWriter{srv: srv, t: t}); err != nil {
		t.Fatal(err)
	}
}

// blockingWriter runs a second backup while the first is writing.
type blockingWriter struct {
	srv *servertest.Server
	t   *testing.T
}

func (b blockingWriter) Write(p []byte) (int, error) {
	if err := b.srv.Backup(context.Background(), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "already running") {
		b.t.Errorf("a backup during a backup = %v, want already running", err)
	}
	return len(p), nil
}
