package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/blob/s3"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/cassandra"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// engineEnv returns $name or skips (fails under CI=true).
func engineEnv(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI requires %s (scripts/engines/up.sh start)", name)
		}
		t.Skipf("%s is unset; run scripts/engines/up.sh start", name)
	}
	return v
}

// view is what one user's SDK client sees of the node: the conversation
// list (unread counts, read and peer positions, last messages), every
// conversation's history, the key directory and the KT log's keys.
type view struct {
	Convs   []protocol.ConvSummary
	History map[uint64][]protocol.Message
	Keys    []protocol.DeviceKeyInfo
	KT      protocol.KTKeys
}

func viewOf(t *testing.T, ctx context.Context, c *client.Client) view {
	t.Helper()
	var convs []protocol.ConvSummary
	var err error
	for range 50 { // until the client is connected
		if convs, err = c.Conversations(ctx); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("conversations: %v", err)
	}
	slices.SortFunc(convs, func(a, b protocol.ConvSummary) int { return int(a.ConvID>>1) - int(b.ConvID>>1) })
	v := view{Convs: convs, History: map[uint64][]protocol.Message{}}
	for _, cv := range convs {
		v.History[cv.ConvID] = history(t, ctx, c, cv.ConvID)
	}
	if v.Keys, err = c.KeyDevices(ctx, "alice"); err != nil {
		t.Fatalf("key devices: %v", err)
	}
	if v.KT, err = c.KTKeys(ctx); err != nil {
		t.Fatalf("kt keys: %v", err)
	}
	return v
}

// cancelAfter is a progress writer that cancels a migration after n
// draws: a kill in the middle of a conversation.
type cancelAfter struct {
	n      atomic.Int64
	cancel context.CancelFunc
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	if c.n.Add(-1) == 0 {
		c.cancel()
	}
	return len(p), nil
}

// TestMigrateFromEmbedded fills an embedded node through the server with
// every kind of data — direct, E2E direct and group conversations, edits,
// a recall, reactions (one taken back), joins and a leave, read positions, an E2E key directory (and
// so the KT log), an attachment, a push registration, a mute and a
// do-not-disturb — stops it, copies it with `parley
// migrate --from` into a fresh Cassandra keyspace and its attachment bytes
// into S3, killed halfway through a conversation and run again, then
// starts a cluster-mode node on the copy: the same SDK clients see the
// same conversation lists, unread counts, positions, histories, key
// directory and KT keys, and download the same file.
func TestMigrateFromEmbedded(t *testing.T) {
	hosts := engineEnv(t, "PARLEY_TEST_CASSANDRA")
	redisAddr := engineEnv(t, "PARLEY_TEST_REDIS")
	natsURL := engineEnv(t, "PARLEY_TEST_NATS")
	s3cfg, err := s3.ParseURL(engineEnv(t, "PARLEY_TEST_S3"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	ks := "tmigf" + hex.EncodeToString(b)
	t.Cleanup(func() {
		cl := gocql.NewCluster(hosts)
		cl.Timeout = 60 * time.Second
		if s, err := cl.CreateSession(); err == nil {
			_ = s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec()
			s.Close()
		}
	})

	// The embedded node and its data.
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	dataDir := t.TempDir()
	src := servertest.Start(t, servertest.WithDataDir(dataDir), servertest.WithKey(key))
	users := []string{"alice", "bob", "carol", "dave"}
	cs := map[string]*client.Client{}
	for _, u := range users {
		cs[u] = startClient(t, ctx, src, u)
	}
	alice, bob, carol := cs["alice"], cs["bob"], cs["carol"]
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	send := func(c *client.Client, conv uint64, body string) uint64 {
		t.Helper()
		var ack client.Ack
		var err error
		for range 50 {
			if ack, err = c.Send(ctx, conv, body); err == nil {
				return ack.Seq
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("send: %v", err)
		return 0
	}
	var d protocol.ConvInfo
	for range 50 {
		if d, err = alice.OpenDirect(ctx, "bob"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	must(err)
	first := send(alice, d.ConvID, "hello bob")
	for i := range 12 {
		send(bob, d.ConvID, "direct "+strings.Repeat("x", i))
	}
	bobs := send(bob, d.ConvID, "to recall")
	_, err = alice.Edit(ctx, d.ConvID, first, "hello bob (edited)")
	must(err)
	_, err = bob.Recall(ctx, d.ConvID, bobs)
	must(err)
	must(alice.MarkRead(ctx, d.ConvID, first+5))

	g, err := alice.CreateGroup(ctx, "team", []string{"bob", "carol"})
	must(err)
	var aliceInGroup uint64
	for i := range 10 {
		if seq := send(cs[users[i%3]], g.ConvID, "group message"); i%3 == 0 {
			aliceInGroup = seq
		}
	}
	_, err = alice.AddMembers(ctx, g.ConvID, []string{"dave"})
	must(err)
	gs := send(carol, g.ConvID, "carol before leaving")
	_, err = alice.Edit(ctx, g.ConvID, aliceInGroup, "edited in the group")
	must(err)
	_, err = carol.Leave(ctx, g.ConvID)
	must(err)
	for range 5 {
		send(bob, g.ConvID, "after carol left")
	}
	// Reactions: counts on their targets and each reactor's own (me),
	// one added and taken back, in both conversations.
	for _, r := range []struct {
		c      *client.Client
		conv   uint64
		seq    uint64
		emoji  string
		remove bool
	}{
		{bob, g.ConvID, gs, "👍", false}, {cs["dave"], g.ConvID, gs, "👍", false}, {bob, g.ConvID, gs, "❤️", false},
		{bob, g.ConvID, gs, "❤️", true}, {bob, d.ConvID, first, "🎉", false},
	} {
		if r.remove {
			_, err = r.c.Unreact(ctx, r.conv, r.seq, r.emoji)
		} else {
			_, err = r.c.React(ctx, r.conv, r.seq, r.emoji)
		}
		must(err)
	}
	// The views compare the peers' delivered positions: wait for alice's
	// device to have acknowledged bob's reaction in the direct
	// conversation.
	for i := 0; ; i++ {
		convs, err := bob.Conversations(ctx)
		must(err)
		j := slices.IndexFunc(convs, func(s protocol.ConvSummary) bool { return s.ConvID == d.ConvID })
		if j >= 0 && convs[j].PeerDeliveredSeq == convs[j].LastSeq {
			break
		}
		if i == 100 {
			t.Fatalf("alice's delivered position in the direct conversation: %+v", convs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	must(bob.MarkRead(ctx, g.ConvID, gs))
	must(cs["dave"].MarkRead(ctx, g.ConvID, gs+2))

	file := bytes.Repeat([]byte("parley attachment "), 4000)
	up, err := alice.Upload(ctx, g.ConvID, bytes.NewReader(file), int64(len(file)), client.UploadOptions{Name: "notes.txt", MediaType: "text/plain"})
	must(err)
	fileAck, err := alice.SendFile(ctx, g.ConvID, up.AttachmentID, client.FileMessage{Caption: "the notes"})
	must(err)

	// An E2E device of alice's (the key directory and the KT log) and an
	// E2E conversation.
	edev, err := e2ee.OpenDevice(e2ee.NewMemoryStore(), e2ee.Address{User: "alice", Device: "phone"})
	must(err)
	_, err = edev.CreateAccountKey()
	must(err)
	ku, err := edev.GenerateKeys(5)
	must(err)
	ak, sig, err := edev.DeviceCertificate()
	must(err)
	k := protocol.KeyUpload{RegistrationID: ku.RegistrationID, IdentityKey: ku.IdentityKey.Bytes(), AccountKey: ak.Bytes(), DeviceSig: sig,
		SignedPreKey:  &protocol.PreKey{ID: ku.SignedPreKey.ID, Key: ku.SignedPreKey.Key.Bytes(), Sig: ku.SignedPreKey.Sig},
		LastResortKEM: &protocol.PreKey{ID: ku.LastResortKEM.ID, Key: ku.LastResortKEM.Key, Sig: ku.LastResortKEM.Sig}}
	for _, p := range ku.PreKeys {
		k.PreKeys = append(k.PreKeys, protocol.PreKey{ID: p.ID, Key: p.Key.Bytes()})
	}
	for _, p := range ku.KEMPreKeys {
		k.KEMPreKeys = append(k.KEMPreKeys, protocol.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
	}
	_, err = alice.UploadKeys(ctx, k)
	must(err)
	_, err = alice.OpenDirectE2E(ctx, "carol")
	must(err)

	// bob mutes the group for good (conv_list's mute_until, compared
	// below) and sleeps nightly (do-not-disturb).
	_, err = bob.MuteConv(ctx, g.ConvID, time.Time{})
	must(err)
	dnd := protocol.DND{Daily: &protocol.DNDWindow{Start: 23 * 60, End: 7 * 60, UTCOffset: 60}}
	_, err = bob.SetDND(ctx, dnd)
	must(err)

	before := map[string]view{}
	for _, u := range users {
		before[u] = viewOf(t, ctx, cs[u])
	}
	// What is compared holds every kind: three conversations of alice's,
	// an edit and a recall, carol's leave, unread counts and positions.
	av := before["alice"]
	var edited, recalled bool
	for _, m := range av.History[d.ConvID] {
		edited, recalled = edited || m.Edited, recalled || m.Recalled
	}
	ci := slices.IndexFunc(before["carol"].Convs, func(s protocol.ConvSummary) bool { return s.ConvID == g.ConvID })
	bi := slices.IndexFunc(before["bob"].Convs, func(s protocol.ConvSummary) bool { return s.ConvID == g.ConvID })
	reacted := false
	for _, m := range before["bob"].History[g.ConvID] {
		reacted = reacted || m.Seq == gs && len(m.Reactions) == 1
	}
	if len(av.Convs) != 3 || !edited || !recalled || !reacted || ci < 0 || before["carol"].Convs[ci].LeaveSeq == 0 ||
		bi < 0 || before["bob"].Convs[bi].Unread == 0 || len(av.Keys) != 1 {
		t.Fatalf("the views before the migration lack some kind of data: alice %+v, carol %+v, bob %+v", av.Convs, before["carol"].Convs, before["bob"].Convs)
	}
	for _, c := range cs {
		c.Close()
	}
	src.Close()
	// A push registration, written into the stopped node's store.
	reg := store.PushReg{UserID: "bob", DeviceID: "phone", Provider: protocol.PushFCM, Token: "fcm-token-bob", UpdatedAt: time.Now().UnixMilli()}
	ps, err := pebble.Open(ctx, pebble.Config{Dir: dataDir + "/store"})
	must(err)
	_, err = ps.PushRegister(ctx, reg, 10)
	must(err)
	must(ps.Close())

	// Migrate, killed in the middle of the direct conversation, then
	// again to the end.
	t.Setenv("PARLEY_CLUSTER_CASSANDRA_HOSTS", hosts)
	t.Setenv("PARLEY_ATTACH_ENGINE", "s3")
	t.Setenv("PARLEY_ATTACH_S3_ENDPOINT", s3cfg.Endpoint)
	t.Setenv("PARLEY_ATTACH_S3_BUCKET", s3cfg.Bucket)
	t.Setenv("PARLEY_ATTACH_S3_ACCESS_KEY", s3cfg.AccessKey)
	t.Setenv("PARLEY_ATTACH_S3_SECRET_KEY", s3cfg.SecretKey)
	args := []string{"--from", dataDir, "--cluster.keyspace", ks}
	oldEvery, oldW := progressEvery, migrateProgress
	t.Cleanup(func() { progressEvery, migrateProgress = oldEvery, oldW })
	progressEvery = 0
	mctx, mcancel := context.WithCancel(ctx)
	killer := &cancelAfter{cancel: mcancel}
	killer.n.Store(8) // after the attachment's draw, 7 messages in
	migrateProgress = killer
	var out bytes.Buffer
	err = runMigrate(mctx, args, &out)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a migrate cancelled halfway: %v\n%s", err, out.String())
	}
	var cp checkpoint
	raw, err := os.ReadFile(dataDir + "/migrate.checkpoint")
	must(err)
	must(json.Unmarshal(raw, &cp))
	if !cp.AttachDone || cp.ConvsDone {
		t.Fatalf("checkpoint after the kill: %+v, want attachments done, conversations not", cp)
	}
	var bar bytes.Buffer
	migrateProgress = &bar
	out.Reset()
	if err := runMigrate(ctx, args, &out); err != nil {
		t.Fatalf("migrate again: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "parley: copied "+dataDir) || !strings.Contains(bar.String(), "100%") || !strings.Contains(bar.String(), "done") {
		t.Errorf("migrate printed %q, bar %q", out.String(), bar.String())
	}
	// A third run finds everything done.
	out.Reset()
	bar.Reset()
	must(runMigrate(ctx, args, &out))

	cstore, err := cassandra.Open(ctx, cassandra.Config{Hosts: strings.Split(hosts, ","), Keyspace: ks})
	must(err)
	regs, err := cstore.PushRegs(ctx, "bob")
	if err != nil || !reflect.DeepEqual(regs, []store.PushReg{reg}) {
		t.Errorf("push registrations after the migration %+v, %v; want %+v", regs, err, reg)
	}
	cstore.Close()

	blobs, err := s3.Open(ctx, s3cfg)
	must(err)
	defer blobs.Close()
	t.Cleanup(func() {
		_ = blobs.Delete(context.Background(), attach.FileKey(up.AttachmentID))
		_ = blobs.Delete(context.Background(), attach.ThumbKey(up.AttachmentID))
	})
	if info, err := blobs.Stat(ctx, attach.FileKey(up.AttachmentID)); err != nil || info.Size != int64(len(file)) {
		t.Fatalf("the file in S3: %+v, %v", info, err)
	}

	// A cluster-mode node on the copy.
	var nb [4]byte
	_, _ = rand.Read(nb[:])
	dst := servertest.Start(t, servertest.WithDataDir(t.TempDir()), servertest.WithKey(key), servertest.WithConfig(func(c *config.Config) {
		c.Cluster.Redis, c.Cluster.NATS, c.Cluster.CassandraHosts = redisAddr, natsURL, hosts
		c.Cluster.Keyspace, c.Cluster.Namespace = ks, "tmigf"+hex.EncodeToString(nb[:])
		c.Attach.Engine = attach.EngineS3
		c.Attach.S3.Endpoint, c.Attach.S3.Bucket, c.Attach.S3.AccessKey, c.Attach.S3.SecretKey = s3cfg.Endpoint, s3cfg.Bucket, s3cfg.AccessKey, s3cfg.SecretKey
		c.Attach.S3.Region, c.Attach.S3.Secure = s3cfg.Region, s3cfg.Secure
	}))
	for _, u := range users {
		c := startClient(t, ctx, dst, u)
		after := viewOf(t, ctx, c)
		if !reflect.DeepEqual(before[u], after) {
			bj, _ := json.MarshalIndent(before[u], "", " ")
			aj, _ := json.MarshalIndent(after, "", " ")
			t.Errorf("%s sees after the migration\n%s\nbefore it\n%s", u, aj, bj)
		}
		if u == "bob" {
			if got, err := c.DND(ctx); err != nil || !reflect.DeepEqual(got, dnd) {
				t.Errorf("bob's do-not-disturb after the migration %+v, %v; want %+v", got, err, dnd)
			}
			var got bytes.Buffer
			if _, _, err := c.Download(ctx, g.ConvID, fileAck.Seq, &got, client.DownloadOptions{}); err != nil || !bytes.Equal(got.Bytes(), file) {
				t.Errorf("download after the migration: %d bytes, %v", got.Len(), err)
			}
		}
	}
}
