package cassandra

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Attachment records (store.Attachments), migration 10:
//
//   - attachments, partition owner, clustering id: the records, and in
//     static columns the owner's usage (bytes, inflight) with rev, its
//     version. Every write of a record is a lightweight transaction, and
//     one that changes the usage is a conditional batch of the record's
//     row and the static columns (one partition, so Paxos applies both or
//     neither): CreateAttachment's quota check reads the usage at rev and
//     its write applies only IF rev is still that, so two processes
//     creating at once cannot both pass the quota — the loser reads again
//     and decides again. UpdateAttachment is IF state = ? AND received = ?
//     (and IF rev = ? when the upload leaves the in-flight count).
//   - attachment_ids: id → owner, inserted IF NOT EXISTS first (an id
//     belongs to one owner), read by Attachment to find the partition.
//   - attachments_by_conv, partition conv: the conversation's records by
//     id (with their owner), for ConvAttachments.
//   - attachments_due, partition (shard, bucket): a row per record that
//     needs work at some time — due is the record's ExpiresAt, or its
//     CreatedAt (a time already past) when it needs work whatever the time
//     (deleting, thumbnail pending); bucket = due / dueBucket, shard = id
//     mod dueShards, so no partition grows beyond the records due within
//     one hour. attachments_due_buckets lists each shard's buckets that may
//     hold rows: a writer writes its row, then the index row; a bucket
//     found empty leaves the index by a delete timestamped before the read
//     that found it empty, which a writer's later index row outlives.
//
// The listing rows are written with plain writes before the record's
// transaction (so a stored record always has them) and the old due row
// deleted after it; the record's due column names its current due row. A
// row whose record is gone or names another due is stale: listings skip
// it, and DueAttachments deletes one written more than dueGrace ago (a
// younger one may belong to a write in progress).

const (
	dueShards = 4
	dueBucket = time.Hour
	// dueGrace: a stale due row older than this is no write in progress.
	dueGrace = 5 * time.Minute
	// dueSkew covers the clock difference between this process and the
	// coordinators that timestamp the writers' index rows.
	dueSkew = time.Minute
	// casTries bounds the compare-and-set loops on one owner's usage.
	casTries = 20
)

var dueBucketMS = dueBucket.Milliseconds()

func dueShard(id uint64) int { return int(id % dueShards) }

// attachColumns are the record's columns scanAttachment reads, in its order.
const attachColumns = `owner, id, device, conv_id, size, sha256, media_type, name, state, created_at, expires_at,
	blob_upload, part_size, received, hash_state, width, height, thumb, ref_client_msg_id, ref_seq, due`

// attachRow is an attachments row as scanned, with its due column.
type attachRow struct {
	a   store.Attachment
	due int64
}

func scanAttachment(scan func(dest ...any) error) (attachRow, error) {
	var (
		r                       attachRow
		id, conv, refSeq        int64
		sha                     []byte
		state, thumb            int8
		received, width, height int
		owner, device, media    string
		name, upload, refCMID   string
		size, created, expires  int64
		partSize                int64
		hashState               []byte
	)
	err := scan(&owner, &id, &device, &conv, &size, &sha, &media, &name, &state, &created, &expires,
		&upload, &partSize, &received, &hashState, &width, &height, &thumb, &refCMID, &refSeq, &r.due)
	if err != nil {
		return attachRow{}, err
	}
	if id == 0 {
		return attachRow{}, nil // a row of the static columns only: no record
	}
	if len(sha) != 32 {
		return attachRow{}, fmt.Errorf("attachment %d: sha256 of %d bytes: %w", id, len(sha), errCorrupt)
	}
	r.a = store.Attachment{
		ID: u64(id), Owner: owner, Device: device, ConvID: u64(conv), Size: size, MediaType: media, Name: name,
		State: store.AttachState(state), CreatedAt: created, ExpiresAt: expires, BlobUpload: upload,
		PartSize: partSize, Received: received, Width: width, Height: height, Thumb: uint8(thumb),
		RefClientMsgID: refCMID, RefSeq: u64(refSeq),
	}
	copy(r.a.SHA256[:], sha)
	if len(hashState) > 0 {
		r.a.HashState = hashState
	}
	return r, nil
}

// needsWork reports whether a is due at now (store.Attachments).
func needsWork(a store.Attachment, now int64) bool {
	return a.State == store.AttachDeleting || a.Thumb == store.ThumbPending || (a.ExpiresAt > 0 && a.ExpiresAt <= now)
}

// urgent: the record needs work whatever the time.
func urgent(a store.Attachment) bool {
	return a.State == store.AttachDeleting || a.Thumb == store.ThumbPending
}

// dueOf is the due of a's row, 0 for none: its ExpiresAt, or its
// CreatedAt (a time already past) when it needs work whatever the time.
func dueOf(a store.Attachment) int64 {
	switch {
	case urgent(a):
		return max(a.CreatedAt, 1)
	case a.ExpiresAt > 0:
		return a.ExpiresAt
	}
	return 0
}

// addDue writes id's due row and its bucket's index row.
func (s *Store) addDue(ctx context.Context, id uint64, owner string, due int64) error {
	if due == 0 {
		return nil
	}
	shard, b := dueShard(id), due/dueBucketMS
	if err := s.q(ctx, `INSERT INTO attachments_due (shard, bucket, due, id, owner) VALUES (?, ?, ?, ?, ?)`,
		shard, b, due, i64(id), owner).Exec(); err != nil {
		return err
	}
	// After the row: a pruning that found the bucket empty before the row
	// deletes the index row with an earlier timestamp than this write.
	if err := s.q(ctx, `INSERT INTO attachments_due_buckets (shard, bucket) VALUES (?, ?)`, shard, b).Exec(); err != nil {
		return fmt.Errorf("due index: %w", err)
	}
	return nil
}

// dropDue deletes id's due row at due; a failure is logged (the row is
// stale, and DueAttachments deletes it later).
func (s *Store) dropDue(ctx context.Context, id uint64, due int64) {
	if due == 0 {
		return
	}
	err := s.q(ctx, `DELETE FROM attachments_due WHERE shard = ? AND bucket = ? AND due = ? AND id = ?`,
		dueShard(id), due/dueBucketMS, due, i64(id)).Exec()
	if err != nil {
		s.log.Warn("cassandra: attachment: a stale due row left behind", "attachment", id, logKeyErr, err)
	}
}

// readUsage reads owner's usage and its rev (0: never written); serial
// reads at SERIAL, after a transaction lost to another.
func (s *Store) readUsage(ctx context.Context, owner string, serial bool) (store.Usage, int64, error) {
	var bytes, rev *int64
	var inflight *int
	q := s.q
	if serial {
		q = s.serialRead
	}
	err := q(ctx, `SELECT bytes, inflight, rev FROM attachments WHERE owner = ? LIMIT 1`, owner).Scan(&bytes, &inflight, &rev)
	if errors.Is(err, gocql.ErrNotFound) {
		return store.Usage{}, 0, nil
	}
	if err != nil {
		return store.Usage{}, 0, err
	}
	var u store.Usage
	var r int64
	if bytes != nil {
		u.Bytes = *bytes
	}
	if inflight != nil {
		u.Inflight = *inflight
	}
	if rev != nil {
		r = *rev
	}
	return u, r, nil
}

// usageCond is the condition on the usage at rev (0: never written).
func usageCond(rev int64) any {
	if rev == 0 {
		return nil // binds null: no usage written yet
	}
	return rev
}

// readRecord reads record id of owner; found false if none.
func (s *Store) readRecord(ctx context.Context, owner string, id uint64, serial bool) (attachRow, bool, error) {
	q := s.q
	if serial {
		q = s.serialRead
	}
	r, err := scanAttachment(q(ctx, `SELECT `+attachColumns+` FROM attachments WHERE owner = ? AND id = ?`, owner, i64(id)).Scan)
	if errors.Is(err, gocql.ErrNotFound) {
		return attachRow{}, false, nil
	}
	// A row of the partition with the static columns only reads as a
	// row with null columns, id among them: not this record.
	if err == nil && r.a.ID != id {
		return attachRow{}, false, nil
	}
	return r, err == nil, err
}

// ownerOf returns the owner of id, "" if no record has it.
func (s *Store) ownerOf(ctx context.Context, id uint64) (string, error) {
	var owner string
	err := s.q(ctx, `SELECT owner FROM attachment_ids WHERE id = ?`, i64(id)).Scan(&owner)
	if errors.Is(err, gocql.ErrNotFound) {
		return "", nil
	}
	return owner, err
}

// recordArgs are the values of a record's columns after owner and id, in
// attachColumns' order, with its due.
func recordArgs(a store.Attachment, due int64) []any {
	return []any{a.Device, i64(a.ConvID), a.Size, a.SHA256[:], a.MediaType, a.Name, int8(a.State), a.CreatedAt,
		a.ExpiresAt, a.BlobUpload, a.PartSize, a.Received, a.HashState, a.Width, a.Height, int8(a.Thumb),
		a.RefClientMsgID, i64(a.RefSeq), due}
}

// sameRecord reports whether a stored row is the record a write wrote
// (settling an unknown outcome).
func sameRecord(r attachRow, a store.Attachment, due int64) bool {
	x, y := r.a, a
	if !bytes.Equal(x.HashState, y.HashState) || r.due != due {
		return false
	}
	x.HashState, y.HashState = nil, nil
	return reflect.DeepEqual(x, y)
}

func (s *Store) CreateAttachment(ctx context.Context, a store.Attachment, quota int64, inflight int) (err error) {
	const op = "create attachment"
	defer func() {
		if err != nil && !errors.Is(err, store.ErrQuota) && !errors.Is(err, store.ErrInflight) && !errors.Is(err, store.ErrExists) {
			err = fmt.Errorf("cassandra: %s %d: %w", op, a.ID, err)
		}
	}()
	cur := map[string]any{}
	claimed, err := s.lwt(ctx, `INSERT INTO attachment_ids (id, owner) VALUES (?, ?) IF NOT EXISTS`, i64(a.ID), a.Owner).MapScanCAS(cur)
	if err != nil {
		// Unknown outcome: whoever holds the id now holds it for good.
		owner, rerr := "", error(nil)
		if rerr = s.serialRead(ctx, `SELECT owner FROM attachment_ids WHERE id = ?`, i64(a.ID)).Scan(&owner); rerr != nil {
			return errors.Join(err, rerr)
		}
		claimed = owner == a.Owner
		cur["owner"] = owner
	}
	if !claimed && cur["owner"] != a.Owner {
		return fmt.Errorf("cassandra: %s %d: %w", op, a.ID, store.ErrExists)
	}
	// Undo the index rows (and the id, if this call claimed it) of a
	// record that is not stored; best effort: listings skip them.
	due := dueOf(a)
	stored := false
	defer func() {
		if stored {
			return
		}
		bg := context.WithoutCancel(ctx)
		s.dropDue(bg, a.ID, due)
		if err := s.q(bg, `DELETE FROM attachments_by_conv WHERE conv_id = ? AND id = ?`, i64(a.ConvID), i64(a.ID)).Exec(); err != nil {
			s.log.Warn("cassandra: attachment: a stale listing row left behind", "attachment", a.ID, logKeyErr, err)
		}
		if claimed {
			_ = s.q(bg, `DELETE FROM attachment_ids WHERE id = ?`, i64(a.ID)).Exec()
		}
	}()
	if err := s.q(ctx, `INSERT INTO attachments_by_conv (conv_id, id, owner) VALUES (?, ?, ?)`, i64(a.ConvID), i64(a.ID), a.Owner).Exec(); err != nil {
		return err
	}
	if err := s.addDue(ctx, a.ID, a.Owner, due); err != nil {
		return err
	}
	serial := false
	for try := 0; ; try++ {
		u, rev, err := s.readUsage(ctx, a.Owner, serial)
		if err != nil {
			return err
		}
		switch {
		case a.Size > quota-u.Bytes:
			return fmt.Errorf("cassandra: %s %d: %s has %d bytes, %d more pass %d: %w", op, a.ID, a.Owner, u.Bytes, a.Size, quota, store.ErrQuota)
		case u.Inflight >= inflight:
			return fmt.Errorf("cassandra: %s %d: %s has %d uploads in flight: %w", op, a.ID, a.Owner, u.Inflight, store.ErrInflight)
		}
		s.paxos.Add(1)
		b := s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx).Consistency(s.cons).SerialConsistency(s.serial)
		b.Query(`UPDATE attachments SET bytes = ?, inflight = ?, rev = ? WHERE owner = ? IF rev = ?`,
			u.Bytes+a.Size, u.Inflight+1, rev+1, a.Owner, usageCond(rev))
		b.Query(`INSERT INTO attachments (`+attachColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS`,
			append([]any{a.Owner, i64(a.ID)}, recordArgs(a, due)...)...)
		applied, iter, err := b.MapExecCAS(map[string]any{})
		if iter != nil {
			if cerr := iter.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil && applied {
			stored = true
			return nil
		}
		// Not applied, or unknown: the record tells (SERIAL finishes a
		// round in progress).
		r, found, rerr := s.readRecord(ctx, a.Owner, a.ID, true)
		switch {
		case rerr != nil:
			return errors.Join(err, rerr)
		case found && err != nil && sameRecord(r, a, due):
			stored = true
			return nil // the transaction whose answer was lost applied
		case found:
			stored = true // another call's record: its index rows stay
			return fmt.Errorf("cassandra: %s %d: %w", op, a.ID, store.ErrExists)
		case err != nil:
			return err
		case try+1 == casTries:
			return fmt.Errorf("usage of %s: still contended after %d tries: %w", a.Owner, casTries, store.ErrConflict)
		}
		// The usage moved on: decide again on what it is now.
		if err := backoff(ctx, min(try, 6)); err != nil {
			return err
		}
		serial = true
	}
}

func (s *Store) Attachment(ctx context.Context, id uint64) (store.Attachment, error) {
	const op = "attachment"
	r, found, err := s.record(ctx, id)
	switch {
	case err != nil:
		return store.Attachment{}, fmt.Errorf("cassandra: %s %d: %w", op, id, err)
	case !found:
		return store.Attachment{}, fmt.Errorf("cassandra: %s %d: %w", op, id, store.ErrNotFound)
	}
	return r.a, nil
}

// record reads record id wherever its owner's partition is.
func (s *Store) record(ctx context.Context, id uint64) (attachRow, bool, error) {
	owner, err := s.ownerOf(ctx, id)
	if err != nil || owner == "" {
		return attachRow{}, false, err
	}
	return s.readRecord(ctx, owner, id, false)
}

func (s *Store) UpdateAttachment(ctx context.Context, a store.Attachment, prev store.Attachment) error {
	const op = "update attachment"
	if err := s.updateAttachment(ctx, a, prev); err != nil {
		return fmt.Errorf("cassandra: %s %d: %w", op, a.ID, err)
	}
	return nil
}

func (s *Store) updateAttachment(ctx context.Context, a store.Attachment, prev store.Attachment) error {
	cur, found, err := s.record(ctx, a.ID)
	switch {
	case err != nil:
		return err
	case !found:
		return store.ErrNotFound
	}
	// What never changes is the stored record's.
	a.Owner, a.ConvID, a.Size, a.CreatedAt = cur.a.Owner, cur.a.ConvID, cur.a.Size, cur.a.CreatedAt
	leaves := prev.State == store.AttachUploading && a.State != store.AttachUploading
	due := dueOf(a)
	added := false
	for try := 0; ; try++ {
		if cur.a.State != prev.State || cur.a.Received != prev.Received {
			return fmt.Errorf("stored state %d received %d, not %d %d: %w", cur.a.State, cur.a.Received, prev.State, prev.Received, store.ErrConflict)
		}
		if due != cur.due && !added {
			if err := s.addDue(ctx, a.ID, a.Owner, due); err != nil {
				return err
			}
			added = true
		}
		set := `UPDATE attachments SET device = ?, conv_id = ?, size = ?, sha256 = ?, media_type = ?, name = ?, state = ?,
			created_at = ?, expires_at = ?, blob_upload = ?, part_size = ?, received = ?, hash_state = ?, width = ?, height = ?,
			thumb = ?, ref_client_msg_id = ?, ref_seq = ?, due = ? WHERE owner = ? AND id = ? IF state = ? AND received = ?`
		args := append(recordArgs(a, due), a.Owner, i64(a.ID), int8(prev.State), prev.Received)
		var (
			applied bool
			err     error
		)
		if leaves {
			u, rev, uerr := s.readUsage(ctx, a.Owner, try > 0)
			if uerr != nil {
				return uerr
			}
			s.paxos.Add(1)
			b := s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx).Consistency(s.cons).SerialConsistency(s.serial)
			b.Query(`UPDATE attachments SET inflight = ?, rev = ? WHERE owner = ? IF rev = ?`,
				max(u.Inflight-1, 0), rev+1, a.Owner, usageCond(rev))
			b.Query(set, args...)
			var iter *gocql.Iter
			applied, iter, err = b.MapExecCAS(map[string]any{})
			if iter != nil {
				if cerr := iter.Close(); err == nil {
					err = cerr
				}
			}
		} else {
			applied, err = s.lwt(ctx, set, args...).MapScanCAS(map[string]any{})
		}
		if err == nil && applied {
			if due != cur.due {
				s.dropDue(ctx, a.ID, cur.due)
			}
			return nil
		}
		next, found, rerr := s.readRecord(ctx, a.Owner, a.ID, true)
		switch {
		case rerr != nil:
			return errors.Join(err, rerr)
		case !found:
			return store.ErrNotFound
		case err != nil && sameRecord(next, a, due):
			if due != cur.due {
				s.dropDue(ctx, a.ID, cur.due)
			}
			return nil // the transaction whose answer was lost applied
		case err != nil:
			return err
		case try+1 == casTries:
			return fmt.Errorf("usage of %s: still contended after %d tries: %w", a.Owner, casTries, store.ErrConflict)
		}
		// The record moved on (the loop's check says so) or, leaving
		// uploading, the usage did: try again against it.
		cur = next
		if next.a.State == prev.State && next.a.Received == prev.Received {
			if err := backoff(ctx, min(try, 6)); err != nil {
				return err
			}
		}
	}
}

func (s *Store) DeleteAttachment(ctx context.Context, id uint64) error {
	const op = "delete attachment"
	if err := s.deleteAttachment(ctx, id); err != nil {
		return fmt.Errorf("cassandra: %s %d: %w", op, id, err)
	}
	return nil
}

func (s *Store) deleteAttachment(ctx context.Context, id uint64) error {
	owner, err := s.ownerOf(ctx, id)
	if err != nil || owner == "" {
		return err
	}
	serial := false
	var conv *uint64 // the deleted record's conversation, if this call read it
	for try := 0; ; try++ {
		cur, found, err := s.readRecord(ctx, owner, id, serial)
		if err != nil {
			return err
		}
		if !found {
			break
		}
		conv = &cur.a.ConvID
		u, rev, err := s.readUsage(ctx, owner, serial)
		if err != nil {
			return err
		}
		next := store.Usage{Bytes: max(u.Bytes-cur.a.Size, 0), Inflight: u.Inflight}
		if cur.a.State == store.AttachUploading {
			next.Inflight = max(next.Inflight-1, 0)
		}
		s.paxos.Add(1)
		b := s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx).Consistency(s.cons).SerialConsistency(s.serial)
		b.Query(`UPDATE attachments SET bytes = ?, inflight = ?, rev = ? WHERE owner = ? IF rev = ?`,
			next.Bytes, next.Inflight, rev+1, owner, usageCond(rev))
		b.Query(`DELETE FROM attachments WHERE owner = ? AND id = ? IF state = ? AND received = ?`,
			owner, i64(id), int8(cur.a.State), cur.a.Received)
		applied, iter, err := b.MapExecCAS(map[string]any{})
		if iter != nil {
			if cerr := iter.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil && applied {
			s.dropDue(ctx, id, cur.due)
			break
		}
		// Not applied (the record or the usage moved on) or unknown: the
		// next round reads at SERIAL and finds the record gone or there.
		if try+1 == casTries {
			return fmt.Errorf("usage of %s: still contended after %d tries: %w", owner, casTries, errors.Join(store.ErrConflict, err))
		}
		if err := backoff(ctx, min(try, 6)); err != nil {
			return err
		}
		serial = true
	}
	// The record is gone: its listing row and its id follow (a listing
	// skips a row left by a failure here).
	if conv != nil {
		if err := s.q(ctx, `DELETE FROM attachments_by_conv WHERE conv_id = ? AND id = ?`, i64(*conv), i64(id)).Exec(); err != nil {
			return err
		}
	}
	return s.q(ctx, `DELETE FROM attachment_ids WHERE id = ?`, i64(id)).Exec()
}

func (s *Store) ConvAttachments(ctx context.Context, conv uint64, after uint64, limit int) ([]store.Attachment, error) {
	const op = "conv attachments"
	var out []store.Attachment
	for len(out) < limit {
		want := limit - len(out)
		iter := s.q(ctx, `SELECT id, owner FROM attachments_by_conv WHERE conv_id = ? AND id > ? LIMIT ?`,
			i64(conv), i64(after), want).Iter()
		type ref struct {
			id    uint64
			owner string
		}
		var (
			refs  []ref
			id    int64
			owner string
		)
		for iter.Scan(&id, &owner) {
			refs = append(refs, ref{u64(id), owner})
		}
		if err := iter.Close(); err != nil {
			return nil, fmt.Errorf("cassandra: %s %d: %w", op, conv, err)
		}
		rows := make([]attachRow, len(refs))
		found := make([]bool, len(refs))
		err := s.each(ctx, len(refs), func(ctx context.Context, i int) error {
			var err error
			rows[i], found[i], err = s.readRecord(ctx, refs[i].owner, refs[i].id, false)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("cassandra: %s %d: %w", op, conv, err)
		}
		for i := range refs {
			if found[i] && rows[i].a.ConvID == conv {
				out = append(out, rows[i].a)
			}
		}
		if len(refs) < want {
			break
		}
		after = refs[len(refs)-1].id
	}
	return out, nil
}

// dueRef is an attachments_due row.
type dueRef struct {
	due     int64
	id      uint64
	owner   string
	written int64 // WRITETIME, unix µs
}

func (s *Store) DueAttachments(ctx context.Context, now int64, limit int) ([]store.Attachment, error) {
	const op = "due attachments"
	out, err := s.dueAttachments(ctx, now, limit)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return out, nil
}

// dueAttachments reads the listed buckets up to now's, oldest first.
func (s *Store) dueAttachments(ctx context.Context, now int64, limit int) ([]store.Attachment, error) {
	type bucket struct {
		shard int
		b     int64
	}
	var buckets []bucket
	last := max(now, 0) / dueBucketMS
	for shard := range dueShards {
		iter := s.q(ctx, `SELECT bucket FROM attachments_due_buckets WHERE shard = ? AND bucket <= ?`, shard, last).Iter()
		var b int64
		for iter.Scan(&b) {
			buckets = append(buckets, bucket{shard, b})
		}
		if err := iter.Close(); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(buckets, func(x, y bucket) int {
		if x.b != y.b {
			return cmp.Compare(x.b, y.b)
		}
		return x.shard - y.shard
	})
	var out []store.Attachment
	seen := map[uint64]bool{}
	for _, bk := range buckets {
		if len(out) >= limit {
			break
		}
		got, err := s.dueIn(ctx, bk.shard, bk.b, now, limit-len(out), seen)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// dueIn lists up to limit records of one due bucket that need work at
// now (not in seen, which it adds them to); it deletes the stale rows it
// meets and, found empty, the bucket's index row.
func (s *Store) dueIn(ctx context.Context, shard int, b, now int64, limit int, seen map[uint64]bool) ([]store.Attachment, error) {
	pruneAt := time.Now().Add(-dueSkew).UnixMicro() // before the read
	iter := s.q(ctx, `SELECT due, id, owner, WRITETIME(owner) FROM attachments_due WHERE shard = ? AND bucket = ? AND due <= ?`,
		shard, b, now).PageSize(min(4*limit, 5000)).Iter()
	var (
		refs  []dueRef
		r     dueRef
		id    int64
		total int
	)
	for iter.Scan(&r.due, &id, &r.owner, &r.written) {
		total++
		r.id = u64(id)
		refs = append(refs, r)
		if len(refs) == 4*limit {
			break // enough to fill the page unless most are stale
		}
	}
	if err := iter.Close(); err != nil {
		return nil, err
	}
	if total == 0 {
		if b < now/dueBucketMS {
			if err := s.pruneDueBucket(ctx, shard, b, pruneAt); err != nil {
				s.log.Warn("cassandra: due attachments: an empty bucket left in the index", "bucket", b, logKeyErr, err)
			}
		}
		return nil, nil
	}
	rows := make([]attachRow, len(refs))
	found := make([]bool, len(refs))
	err := s.each(ctx, len(refs), func(ctx context.Context, i int) error {
		var err error
		rows[i], found[i], err = s.readRecord(ctx, refs[i].owner, refs[i].id, false)
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []store.Attachment
	old := time.Now().Add(-dueGrace).UnixMicro()
	for i, ref := range refs {
		// A stale row may be a write in progress (rows are written before
		// the record): only an old one goes.
		if (!found[i] || rows[i].due != ref.due) && ref.written < old {
			s.dropDue(ctx, ref.id, ref.due)
		}
		if found[i] && !seen[ref.id] && needsWork(rows[i].a, now) && len(out) < limit {
			seen[ref.id] = true
			out = append(out, rows[i].a)
		}
	}
	return out, nil
}

// pruneDueBucket removes bucket b from the index if it has no row. The
// delete has timestamp at, taken before the read that found the bucket
// empty: a writer that adds a row meanwhile writes the index row after
// its row, with a later timestamp, which the delete does not shadow.
func (s *Store) pruneDueBucket(ctx context.Context, shard int, b, at int64) error {
	var id int64
	err := s.q(ctx, `SELECT id FROM attachments_due WHERE shard = ? AND bucket = ? LIMIT 1`, shard, b).Scan(&id)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, gocql.ErrNotFound):
		return err
	}
	return s.q(ctx, `DELETE FROM attachments_due_buckets USING TIMESTAMP ? WHERE shard = ? AND bucket = ?`, at, shard, b).Exec()
}

func (s *Store) AttachmentUsage(ctx context.Context, owner string) (store.Usage, error) {
	u, _, err := s.readUsage(ctx, owner, false)
	if err != nil {
		return store.Usage{}, fmt.Errorf("cassandra: attachment usage %s: %w", owner, err)
	}
	return u, nil
}
