package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/attach"
	"github.com/parley-im/parley/internal/blob"
	"github.com/parley-im/parley/internal/blob/disk"
	blobs3 "github.com/parley-im/parley/internal/blob/s3"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	"github.com/parley-im/parley/protocol"
)

// checkpoint is what a migration has finished, written after each step so
// that a migrate run again after a kill continues there. Every write of
// the copy is idempotent besides (a conversation continues from the
// target's last seq), so a checkpoint older than the target only repeats
// work.
type checkpoint struct {
	Target      string `json:"target"` // keyspace and hosts: a checkpoint for another target is refused
	Attachments uint64 `json:"attachments"`
	AttachDone  bool   `json:"attachments_done"`
	Conv        uint64 `json:"conversation"` // every conversation up to this id is copied
	ConvsDone   bool   `json:"conversations_done"`
	Positions   bool   `json:"positions"`
	Keys        bool   `json:"keys"`
	KT          bool   `json:"kt"`
	Push        bool   `json:"push"`
	Notify      bool   `json:"notify"`
	Messages    uint64 `json:"messages"` // copied so far (the progress bar)
	// The durable queues (migratequeues.go).
	Webhooks  queueProgress `json:"webhook_queue"`
	PushQueue queueProgress `json:"push_queue"`
	Ledger    queueProgress `json:"ledger"`
}

// queueProgress is how far the copy of one queue is.
type queueProgress struct {
	Cursor []byte `json:"cursor,omitempty"` // the source's place of the last event copied
	Copied uint64 `json:"copied"`           // events copied (the progress bar)
	Done   bool   `json:"done"`
}

func loadCheckpoint(path, target string) (checkpoint, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return checkpoint{Target: target}, nil
	}
	if err != nil {
		return checkpoint{}, err
	}
	var c checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return checkpoint{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if c.Target != target {
		return checkpoint{}, fmt.Errorf("checkpoint %s is of a migration to %s, not %s: delete it to start over", path, c.Target, target)
	}
	return c, nil
}

func (c checkpoint) save(path string) error {
	b, _ := json.Marshal(c)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// progressEvery is how often the bar is drawn at most.
var progressEvery = 200 * time.Millisecond

// progress draws a bar on w (stderr), at most every progressEvery.
type progress struct {
	w          io.Writer
	total      uint64
	done       uint64
	what       string
	last       time.Time
	convs, all int
}

func (p *progress) draw(force bool) {
	if p.w == nil || (!force && time.Since(p.last) < progressEvery) {
		return
	}
	p.last = time.Now()
	const width = 30
	frac := 1.0
	if p.total > 0 {
		frac = math.Min(1, float64(p.done)/float64(p.total))
	}
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%% %d/%d messages, %d/%d conversations %s\x1b[K",
		strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, p.done, p.total, p.convs, p.all, p.what)
}

// migration copies an embedded node's store (and blobs) into a cluster's.
type migration struct {
	src     store.Store
	exp     store.Exporter
	dst     store.Store
	srcBlob blob.Store // nil: the source has no blobs directory
	dstBlob blob.Store // nil: the target keeps no blobs (disk on the same node)
	cp      checkpoint
	cpPath  string
	bar     *progress
	pending map[store.Pending]bool // the source's outstanding fan-out
	queues  *queues                // nil: the source's queues are empty
}

const exportPage = 500

func (m *migration) step(f func() error) error {
	if err := f(); err != nil {
		return err
	}
	return m.cp.save(m.cpPath)
}

func (m *migration) run(ctx context.Context) error {
	ps, err := m.src.Pending(ctx, 1<<22)
	if err != nil {
		return err
	}
	m.pending = map[store.Pending]bool{}
	for _, p := range ps {
		m.pending[p] = true
	}
	// The bar's total: every message of every conversation.
	for after := uint64(0); ; {
		cs, err := m.exp.ExportConversations(ctx, after, exportPage)
		if err != nil {
			return err
		}
		if len(cs) == 0 {
			break
		}
		for _, c := range cs {
			m.bar.total += c.LastSeq
			m.bar.all++
			if c.ID <= m.cp.Conv {
				m.bar.convs++
			}
		}
		after = cs[len(cs)-1].ID
	}
	m.bar.done = m.cp.Messages
	if !m.cp.AttachDone {
		if err := m.attachments(ctx); err != nil {
			return fmt.Errorf("attachments: %w", err)
		}
	}
	if !m.cp.ConvsDone {
		if err := m.conversations(ctx); err != nil {
			return fmt.Errorf("conversations: %w", err)
		}
	}
	if !m.cp.Positions {
		m.bar.what = "(positions)"
		if err := m.step(func() error { m.cp.Positions = true; return m.positions(ctx) }); err != nil {
			return fmt.Errorf("positions: %w", err)
		}
	}
	if !m.cp.Keys {
		m.bar.what = "(key directory)"
		if err := m.step(func() error { m.cp.Keys = true; return m.keys(ctx) }); err != nil {
			return fmt.Errorf("key directory: %w", err)
		}
	}
	if !m.cp.KT {
		m.bar.what = "(key transparency log)"
		if err := m.step(func() error { m.cp.KT = true; return m.kt(ctx) }); err != nil {
			return fmt.Errorf("key transparency log: %w", err)
		}
	}
	if !m.cp.Push {
		m.bar.what = "(push registrations)"
		if err := m.step(func() error { m.cp.Push = true; return m.push(ctx) }); err != nil {
			return fmt.Errorf("push registrations: %w", err)
		}
	}
	if !m.cp.Notify {
		m.bar.what = "(mutes and do-not-disturb)"
		if err := m.step(func() error { m.cp.Notify = true; return m.notify(ctx) }); err != nil {
			return fmt.Errorf("mutes and do-not-disturb: %w", err)
		}
	}
	if err := m.copyQueues(ctx); err != nil {
		return err
	}
	m.bar.what = "done"
	m.bar.draw(true)
	if m.bar.w != nil {
		fmt.Fprintln(m.bar.w)
	}
	return nil
}

func (m *migration) attachments(ctx context.Context) error {
	m.bar.what = "(attachments)"
	for {
		as, err := m.exp.ExportAttachments(ctx, m.cp.Attachments, exportPage)
		if err != nil {
			return err
		}
		if len(as) == 0 {
			return m.step(func() error { m.cp.AttachDone = true; return nil })
		}
		for _, a := range as {
			if err := m.step(func() error { m.cp.Attachments = a.ID; return m.attachment(ctx, a) }); err != nil {
				return fmt.Errorf("attachment %d: %w", a.ID, err)
			}
			m.bar.draw(false)
		}
	}
}

func (m *migration) attachment(ctx context.Context, a store.Attachment) error {
	// The bytes first: a record never names a blob the target lacks.
	if m.srcBlob != nil && m.dstBlob != nil && a.State != store.AttachUploading {
		if err := copyBlob(ctx, m.srcBlob, m.dstBlob, attach.FileKey(a.ID), a.Size, a.SHA256, false); err != nil {
			return err
		}
		if a.Thumb == store.ThumbReady {
			if err := copyBlob(ctx, m.srcBlob, m.dstBlob, attach.ThumbKey(a.ID), -1, [32]byte{}, true); err != nil {
				return err
			}
		}
	}
	cur, err := m.dst.Attachment(ctx, a.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		first := a
		first.State, first.ExpiresAt = store.AttachUploading, a.ExpiresAt
		if err := m.dst.CreateAttachment(ctx, first, math.MaxInt64, math.MaxInt32); err != nil {
			return err
		}
		cur = first
	case err != nil:
		return err
	}
	if cur.State == a.State && cur.Received == a.Received && cur.Thumb == a.Thumb && cur.RefSeq == a.RefSeq {
		return nil
	}
	return m.dst.UpdateAttachment(ctx, a, cur)
}

// copyBlob copies key unless the target has it whole; with hash the sum
// is computed here (a thumbnail's is not recorded).
func copyBlob(ctx context.Context, src, dst blob.Store, key string, size int64, sum [32]byte, hash bool) error {
	r, info, err := src.Open(ctx, key, 0, -1)
	if errors.Is(err, blob.ErrNotFound) {
		return nil // gone already (a deleting record)
	}
	if err != nil {
		return err
	}
	defer r.Close()
	if have, err := dst.Stat(ctx, key); err == nil && have.Size == info.Size {
		return nil
	}
	if hash {
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		return dst.Put(ctx, key, strings.NewReader(string(b)), int64(len(b)), sha256.Sum256(b))
	}
	if size < 0 {
		size = info.Size
	}
	return dst.Put(ctx, key, r, size, sum)
}

func (m *migration) conversations(ctx context.Context) error {
	for {
		cs, err := m.exp.ExportConversations(ctx, m.cp.Conv, exportPage)
		if err != nil {
			return err
		}
		if len(cs) == 0 {
			return m.step(func() error { m.cp.ConvsDone = true; return nil })
		}
		for _, c := range cs {
			m.bar.what = fmt.Sprintf("(conversation %d)", c.ID)
			if err := m.conversation(ctx, c); err != nil {
				return fmt.Errorf("conversation %d: %w", c.ID, err)
			}
			m.bar.convs++
			if err := m.step(func() error { m.cp.Conv = c.ID; m.cp.Messages = m.bar.done; return nil }); err != nil {
				return err
			}
		}
	}
}

// conversation copies c: created with its first members, then its
// messages replayed in seq order with each membership's join and leave at
// the seq it had, then its rows, tier, roles and mutes. It continues from
// the target's last seq, so a conversation half copied by a killed run is
// finished without a message twice.
func (m *migration) conversation(ctx context.Context, c store.Conversation) error {
	members, err := m.exp.ExportMembers(ctx, c.ID)
	if err != nil {
		return err
	}
	got, err := m.dst.Conversation(ctx, c.ID)
	if errors.Is(err, store.ErrNotFound) {
		got, err = m.create(ctx, c, members)
	}
	if err != nil {
		return err
	}
	if got.Kind != c.Kind || got.E2E != c.E2E {
		return fmt.Errorf("the target's conversation %d is a %v (e2e %v), the source's a %v (e2e %v)", c.ID, got.Kind, got.E2E, c.Kind, c.E2E)
	}
	m.bar.done += got.LastSeq
	for x := got.LastSeq; ; x++ {
		if err := m.memberships(ctx, c.ID, members, x); err != nil {
			return err
		}
		if x >= c.LastSeq {
			break
		}
		msgs, err := m.src.Messages(ctx, c.ID, x+1, min(c.LastSeq, x+200), 200)
		if err != nil {
			return err
		}
		if len(msgs) == 0 || msgs[0].Seq != x+1 {
			return fmt.Errorf("the source has no message %d", x+1)
		}
		if err := m.appendMsg(ctx, c.ID, msgs[0]); err != nil {
			return fmt.Errorf("message %d: %w", x+1, err)
		}
		m.bar.done++
		m.bar.draw(false)
	}
	if c.Tier != 0 {
		if err := m.dst.SetTier(ctx, c.ID, c.Tier); err != nil {
			return err
		}
	}
	for _, mb := range members {
		if mb.LeaveSeq != 0 {
			continue
		}
		if mb.Muted {
			if err := m.dst.SetMuted(ctx, c.ID, mb.UserID, true); err != nil {
				return err
			}
		}
		if err := m.dst.SetRole(ctx, c.ID, mb.UserID, mb.Role); err != nil {
			return err
		}
	}
	return m.rows(ctx, c.ID, members)
}

func (m *migration) create(ctx context.Context, c store.Conversation, members []store.Member) (store.Conversation, error) {
	if c.Kind == store.Direct {
		if len(members) != 2 {
			return store.Conversation{}, fmt.Errorf("a direct conversation of %d members", len(members))
		}
		open := m.dst.Direct
		if c.E2E {
			open = m.dst.DirectE2E
		}
		got, err := open(ctx, members[0].UserID, members[1].UserID, c.ID, c.CreatedAt)
		if err == nil && got.ID != c.ID {
			err = fmt.Errorf("the target already has conversation %d for the pair", got.ID)
		}
		return got, err
	}
	var first []store.Member
	for _, mb := range members {
		if mb.JoinSeq <= 1 {
			first = append(first, store.Member{ConvID: c.ID, UserID: mb.UserID, Role: mb.Role, JoinSeq: 1})
		}
	}
	nc := store.Conversation{ID: c.ID, Kind: c.Kind, Name: c.Name, CreatedAt: c.CreatedAt, E2E: c.E2E}
	if err := m.dst.CreateConversation(ctx, nc, first); err != nil {
		return store.Conversation{}, err
	}
	return m.dst.Conversation(ctx, c.ID)
}

// memberships applies, with the target's last seq at x, the leaves at x,
// the joins at x+1 (by role), then the leaves at x of those joined at x+1.
func (m *migration) memberships(ctx context.Context, conv uint64, members []store.Member, x uint64) error {
	leave := func(joinedNow bool) error {
		var users []string
		for _, mb := range members {
			if mb.LeaveSeq == x && mb.LeaveSeq != 0 && (mb.JoinSeq == x+1) == joinedNow {
				users = append(users, mb.UserID)
			}
		}
		if len(users) == 0 {
			return nil
		}
		_, err := m.dst.RemoveMembers(ctx, conv, users)
		return err
	}
	if err := leave(false); err != nil {
		return err
	}
	if x > 0 {
		byRole := map[store.Role][]string{}
		for _, mb := range members {
			if mb.JoinSeq == x+1 {
				byRole[mb.Role] = append(byRole[mb.Role], mb.UserID)
			}
		}
		for role, users := range byRole {
			if _, err := m.dst.AddMembers(ctx, conv, users, role); err != nil {
				return err
			}
		}
	}
	return leave(true)
}

// appendMsg stores msg with the seq it has: as it was when appended, and
// an edit or recall rewriting its target as the source's did.
func (m *migration) appendMsg(ctx context.Context, conv uint64, msg store.Message) error {
	orig := []store.Message{msg}
	if err := m.src.AsOf(ctx, conv, msg.Seq, orig); err != nil {
		return err
	}
	a := store.Append{Msg: orig[0]}
	a.Msg.Superseded = false
	if k := msg.Kind; k == protocol.KindReact || k == protocol.KindUnreact {
		// A reaction event's body is its emoji; the target's counts and
		// the reactor's own set are made again by the reaction's append.
		a.React = &store.React{Emoji: orig[0].Body, Remove: k == protocol.KindUnreact}
	}
	if msg.TargetSeq != 0 {
		a.Check = func(target store.Message) (store.Message, error) {
			ts, err := m.src.Messages(ctx, conv, msg.TargetSeq, msg.TargetSeq, 1)
			if err != nil || len(ts) == 0 {
				return target, err
			}
			if err := m.src.AsOf(ctx, conv, msg.Seq, ts); err != nil {
				return store.Message{}, err
			}
			next := target
			next.Body, next.Edited, next.Recalled, next.Attachment = ts[0].Body, ts[0].Edited, ts[0].Recalled, ts[0].Attachment
			return next, nil
		}
	}
	res, err := m.dst.Append(ctx, a)
	if err != nil {
		return err
	}
	if res.Duplicate || res.Msg.Seq != msg.Seq {
		return fmt.Errorf("stored as seq %d (duplicate %v): client_msg_id %q of %s reused", res.Msg.Seq, res.Duplicate, msg.ClientMsgID, msg.Sender)
	}
	if !m.pending[store.Pending{ConvID: conv, Seq: msg.Seq}] {
		return m.dst.FanoutDone(ctx, conv, []uint64{msg.Seq})
	}
	return nil
}

// rows raises each member's conversation row to the source's.
func (m *migration) rows(ctx context.Context, conv uint64, members []store.Member) error {
	for _, mb := range members {
		rows, err := m.src.UserConversations(ctx, mb.UserID)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(rows, func(r store.ConvRow) bool { return r.ConvID == conv })
		if i < 0 {
			continue
		}
		if r := rows[i]; r.MentionSeq > 0 {
			if err := m.dst.UpdateRows(ctx, conv, r.MentionSeq, []string{mb.UserID}, true); err != nil {
				return err
			}
		}
		if err := m.dst.UpdateRows(ctx, conv, rows[i].LastSeq, []string{mb.UserID}, false); err != nil {
			return err
		}
	}
	return nil
}

func (m *migration) positions(ctx context.Context) error {
	return m.exp.ExportPositions(ctx, func(p store.Position) error {
		var err error
		if p.Delivered {
			_, err = m.dst.SetDelivered(ctx, p.User, p.ConvID, p.Seq)
		} else {
			_, err = m.dst.SetRead(ctx, p.User, p.Device, p.ConvID, p.Seq)
		}
		return err
	})
}

func (m *migration) keys(ctx context.Context) error {
	return m.exp.ExportKeys(ctx, func(d store.DeviceKeys, pre, kem []store.PreKey) error {
		spk, lr := d.SignedPreKey, d.LastResortKEM
		_, err := m.dst.UploadKeys(ctx, d.UserID, d.DeviceID, store.KeyUpload{
			RegistrationID: d.RegistrationID, IdentityKey: d.IdentityKey,
			AccountKey: d.AccountKey, DeviceSig: d.DeviceSig,
			SignedPreKey: &spk, LastResortKEM: &lr, PreKeys: pre, KEMPreKeys: kem, Now: d.UpdatedAt,
		})
		return err
	})
}

func (m *migration) kt(ctx context.Context) error {
	keys, err := m.exp.ExportKTKeys(ctx)
	if err != nil || keys == nil {
		return err // no log yet: nothing to copy
	}
	got, err := m.dst.KTKeys(ctx, keys)
	if err != nil {
		return err
	}
	if string(got) != string(keys) {
		return errors.New("the target holds other key transparency keys")
	}
	for from := uint64(0); ; {
		leaves, err := m.src.KTLeaves(ctx, from, store.MaxKTPage)
		if err != nil {
			return err
		}
		if len(leaves) == 0 {
			return nil
		}
		for i, leaf := range leaves {
			idx := from + uint64(i)
			err := m.dst.KTAppend(ctx, idx, leaf)
			if errors.Is(err, store.ErrConflict) {
				have, err := m.dst.KTLeaves(ctx, idx, 1)
				if err != nil {
					return err
				}
				if len(have) != 1 || string(have[0]) != string(leaf) {
					return fmt.Errorf("the target's log differs at leaf %d", idx)
				}
				continue
			}
			if err != nil {
				return err
			}
		}
		from += uint64(len(leaves))
	}
}

func (m *migration) push(ctx context.Context) error {
	regs, err := m.exp.ExportPushRegs(ctx)
	if err != nil {
		return err
	}
	for _, r := range regs {
		if _, err := m.dst.PushRegister(ctx, r, math.MaxInt32); err != nil {
			return err
		}
	}
	return nil
}

// notify copies every user's conversation mutes and do-not-disturb
// (rewriting one already copied is harmless).
func (m *migration) notify(ctx context.Context) error {
	return m.exp.ExportNotify(ctx, func(user string, mutes map[uint64]int64, d store.DND) error {
		for conv, until := range mutes {
			if err := m.dst.SetConvMute(ctx, user, conv, until); err != nil {
				return err
			}
		}
		if d.Zero() {
			return nil
		}
		return m.dst.SetDND(ctx, user, d)
	})
}

// openMigrationBlobs opens the source's blobs directory and, when the
// target keeps attachments in S3, the bucket.
func openMigrationBlobs(ctx context.Context, from string, cfg config.Config) (src, dst blob.Store, err error) {
	dir := filepath.Join(from, "blobs")
	if _, err := os.Stat(dir); err != nil {
		return nil, nil, nil
	}
	if cfg.Attach.Engine != attach.EngineS3 {
		return nil, nil, nil
	}
	secret := cfg.Attach.S3.SecretKey
	if cfg.Attach.S3.SecretKeyFile != "" {
		b, err := os.ReadFile(cfg.Attach.S3.SecretKeyFile)
		if err != nil {
			return nil, nil, err
		}
		secret = strings.TrimSpace(string(b))
	}
	d, err := blobs3.Open(ctx, blobs3.Config{
		Endpoint: cfg.Attach.S3.Endpoint, Bucket: cfg.Attach.S3.Bucket, Region: cfg.Attach.S3.Region,
		AccessKey: cfg.Attach.S3.AccessKey, SecretKey: secret, Secure: cfg.Attach.S3.Secure,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open S3: %w", err)
	}
	s, err := disk.Open(dir)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return s, d, nil
}

// openSource opens an embedded node's store read for migration.
func openSource(ctx context.Context, from string, cfg config.Config) (store.Store, store.Exporter, error) {
	dir := filepath.Join(from, "store")
	if _, err := os.Stat(dir); err != nil {
		return nil, nil, fmt.Errorf("--from %s: no embedded store there (%w)", from, err)
	}
	src, err := pebble.Open(ctx, pebble.Config{Dir: dir, BucketWidth: cfg.Store.BucketWidth})
	if err != nil {
		return nil, nil, fmt.Errorf("--from %s (is its node stopped?): %w", from, err)
	}
	exp, ok := store.ExporterOf(src)
	if !ok {
		src.Close()
		return nil, nil, errors.New("the embedded store cannot list its contents")
	}
	return src, exp, nil
}
