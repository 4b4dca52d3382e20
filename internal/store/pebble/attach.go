package pebble

import (
	"context"
	"encoding/binary"
	"fmt"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// Attachment records (store.Attachments):
//
//	F      F | id                     the record                     attachments
//	G      G | conv | id              (empty)                        attachments_by_conv, partition conv
//	W      W | due u64 | id           (empty)                        attachments_due, partition (shard, bucket)
//	Q      Q | owner                  bytes, uploads in flight       attachment_usage
//
// due is the record's CreatedAt when it needs work whatever the time
// (deleting, or a thumbnail pending), its ExpiresAt otherwise; a record
// with neither has no W row. DueAttachments reads W up to now, by due.
//
// Every attachment write runs under attMu and is one synced batch: the
// record, its index rows and its owner's usage change together, and the
// quota check of CreateAttachment reads the usage in the same critical
// section as the write that raises it. Uploads are rare next to messages,
// so one lock costs nothing that matters.

const (
	tagAttach     = 'F'
	tagAttachConv = 'G'
	tagAttachDue  = 'W'
	tagAttachUse  = 'Q'
)

func attachKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(tagged(tagAttach, 9), id)
}

func attachConvPrefix(conv uint64) []byte {
	return binary.BigEndian.AppendUint64(tagged(tagAttachConv, 17), conv)
}

func attachConvKey(conv, id uint64) []byte {
	return binary.BigEndian.AppendUint64(attachConvPrefix(conv), id)
}

func attachDueKey(due, id uint64) []byte {
	k := binary.BigEndian.AppendUint64(tagged(tagAttachDue, 17), due)
	return binary.BigEndian.AppendUint64(k, id)
}

func attachUseKey(owner string) []byte {
	return append(tagged(tagAttachUse, 1+len(owner)), owner...)
}

// dueOf is when a needs work (the W row's due), ok false when never.
func dueOf(a store.Attachment) (due uint64, ok bool) {
	switch {
	case a.State == store.AttachDeleting || a.Thumb == store.ThumbPending:
		return uint64(max(a.CreatedAt, 1)), true
	case a.ExpiresAt > 0:
		return uint64(a.ExpiresAt), true
	}
	return 0, false
}

// setDue replaces the W row of old (nil: none) by next's.
func setDue(b *cpebble.Batch, old *store.Attachment, next store.Attachment) error {
	od, had := uint64(0), false
	if old != nil {
		od, had = dueOf(*old)
	}
	nd, has := dueOf(next)
	if had == has && od == nd {
		return nil
	}
	if had {
		if err := b.Delete(attachDueKey(od, next.ID), nil); err != nil {
			return err
		}
	}
	if has {
		return b.Set(attachDueKey(nd, next.ID), nil, nil)
	}
	return nil
}

// setUsage writes owner's usage u (the row goes when u is zero).
func setUsage(b *cpebble.Batch, owner string, u store.Usage) error {
	if u == (store.Usage{}) {
		return b.Delete(attachUseKey(owner), nil)
	}
	return b.Set(attachUseKey(owner), encodeUsage(u), nil)
}

// attachRecord reads record id; found false if none.
func (s *Store) attachRecord(id uint64) (store.Attachment, bool, error) {
	v, found, err := s.get(attachKey(id))
	if err != nil || !found {
		return store.Attachment{}, false, err
	}
	a, err := decodeAttachment(id, v)
	return a, err == nil, err
}

func (s *Store) usage(owner string) (store.Usage, error) {
	v, found, err := s.get(attachUseKey(owner))
	if err != nil || !found {
		return store.Usage{}, err
	}
	return decodeUsage(v)
}

// commitAttach commits b synced; attMu held.
func (s *Store) commitAttach(b *cpebble.Batch) error {
	if err := b.Commit(syncWrite); err != nil {
		s.fail(err)
		return err
	}
	return nil
}

func (s *Store) CreateAttachment(ctx context.Context, a store.Attachment, quota int64, inflight int) error {
	const op = "create attachment"
	s.attMu.Lock()
	defer s.attMu.Unlock()
	taken, err := s.exists(attachKey(a.ID))
	if err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, a.ID, err)
	}
	if taken {
		return fmt.Errorf("pebble: %s %d: %w", op, a.ID, store.ErrExists)
	}
	u, err := s.usage(a.Owner)
	if err != nil {
		return fmt.Errorf("pebble: %s %d: usage of %s: %w", op, a.ID, a.Owner, err)
	}
	switch {
	case a.Size > quota-u.Bytes:
		return fmt.Errorf("pebble: %s %d: %s has %d bytes, %d more pass %d: %w", op, a.ID, a.Owner, u.Bytes, a.Size, quota, store.ErrQuota)
	case u.Inflight >= inflight:
		return fmt.Errorf("pebble: %s %d: %s has %d uploads in flight: %w", op, a.ID, a.Owner, u.Inflight, store.ErrInflight)
	}
	u.Bytes += a.Size
	u.Inflight++
	b := s.db.NewBatch()
	defer b.Close()
	err = b.Set(attachKey(a.ID), encodeAttachment(a), nil)
	if err == nil {
		err = b.Set(attachConvKey(a.ConvID, a.ID), nil, nil)
	}
	if err == nil {
		err = setDue(b, nil, a)
	}
	if err == nil {
		err = setUsage(b, a.Owner, u)
	}
	if err == nil {
		err = s.commitAttach(b)
	}
	if err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, a.ID, err)
	}
	return nil
}

func (s *Store) Attachment(ctx context.Context, id uint64) (store.Attachment, error) {
	const op = "attachment"
	a, found, err := s.attachRecord(id)
	switch {
	case err != nil:
		return store.Attachment{}, fmt.Errorf("pebble: %s %d: %w", op, id, err)
	case !found:
		return store.Attachment{}, fmt.Errorf("pebble: %s %d: %w", op, id, store.ErrNotFound)
	}
	return a, nil
}

func (s *Store) UpdateAttachment(ctx context.Context, a store.Attachment, prev store.Attachment) error {
	const op = "update attachment"
	s.attMu.Lock()
	defer s.attMu.Unlock()
	cur, found, err := s.attachRecord(a.ID)
	switch {
	case err != nil:
		return fmt.Errorf("pebble: %s %d: %w", op, a.ID, err)
	case !found:
		return fmt.Errorf("pebble: %s %d: %w", op, a.ID, store.ErrNotFound)
	case cur.State != prev.State || cur.Received != prev.Received:
		return fmt.Errorf("pebble: %s %d: stored state %d received %d, not %d %d: %w",
			op, a.ID, cur.State, cur.Received, prev.State, prev.Received, store.ErrConflict)
	}
	// What never changes is the stored record's.
	a.Owner, a.ConvID, a.Size, a.CreatedAt = cur.Owner, cur.ConvID, cur.Size, cur.CreatedAt
	b := s.db.NewBatch()
	defer b.Close()
	err = b.Set(attachKey(a.ID), encodeAttachment(a), nil)
	if err == nil {
		err = setDue(b, &cur, a)
	}
	if err == nil && cur.State == store.AttachUploading && a.State != store.AttachUploading {
		var u store.Usage
		if u, err = s.usage(a.Owner); err == nil {
			u.Inflight = max(u.Inflight-1, 0)
			err = setUsage(b, a.Owner, u)
		}
	}
	if err == nil {
		err = s.commitAttach(b)
	}
	if err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, a.ID, err)
	}
	return nil
}

func (s *Store) DeleteAttachment(ctx context.Context, id uint64) error {
	const op = "delete attachment"
	s.attMu.Lock()
	defer s.attMu.Unlock()
	cur, found, err := s.attachRecord(id)
	if err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, id, err)
	}
	if !found {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	err = b.Delete(attachKey(id), nil)
	if err == nil {
		err = b.Delete(attachConvKey(cur.ConvID, id), nil)
	}
	if d, ok := dueOf(cur); err == nil && ok {
		err = b.Delete(attachDueKey(d, id), nil)
	}
	var u store.Usage
	if err == nil {
		u, err = s.usage(cur.Owner)
	}
	if err == nil {
		u.Bytes = max(u.Bytes-cur.Size, 0)
		if cur.State == store.AttachUploading {
			u.Inflight = max(u.Inflight-1, 0)
		}
		err = setUsage(b, cur.Owner, u)
	}
	if err == nil {
		err = s.commitAttach(b)
	}
	if err != nil {
		return fmt.Errorf("pebble: %s %d: %w", op, id, err)
	}
	return nil
}

func (s *Store) ConvAttachments(ctx context.Context, conv uint64, after uint64, limit int) ([]store.Attachment, error) {
	const op = "conv attachments"
	p := attachConvPrefix(conv)
	ids, err := s.keyIDs(attachConvKey(conv, after+1), prefixEnd(p), limit)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, conv, err)
	}
	out, err := s.attachRecords(ids)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s %d: %w", op, conv, err)
	}
	return out, nil
}

func (s *Store) DueAttachments(ctx context.Context, now int64, limit int) ([]store.Attachment, error) {
	const op = "due attachments"
	if now <= 0 {
		return nil, nil // every due is above 0
	}
	ids, err := s.keyIDs([]byte{tagAttachDue}, attachDueKey(uint64(now)+1, 0), limit)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	out, err := s.attachRecords(ids)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return out, nil
}

// keyIDs returns the ids that end the keys in [lower, upper), up to limit.
func (s *Store) keyIDs(lower, upper []byte, limit int) ([]uint64, error) {
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for ok := it.First(); ok && len(ids) < limit; ok = it.Next() {
		k := it.Key()
		if len(k) < 9 {
			_ = it.Close()
			return nil, fmt.Errorf("index key %x: %w", k, errCorrupt)
		}
		ids = append(ids, binary.BigEndian.Uint64(k[len(k)-8:]))
	}
	return ids, it.Close()
}

// attachRecords reads the records of ids. Index rows are written in the
// records' batches, so every id has its record; one missing is skipped
// (never seen, but a listing need not fail for it).
func (s *Store) attachRecords(ids []uint64) ([]store.Attachment, error) {
	out := make([]store.Attachment, 0, len(ids))
	for _, id := range ids {
		a, found, err := s.attachRecord(id)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, a)
		}
	}
	return out, nil
}

func (s *Store) AttachmentUsage(ctx context.Context, owner string) (store.Usage, error) {
	u, err := s.usage(owner)
	if err != nil {
		return store.Usage{}, fmt.Errorf("pebble: attachment usage %s: %w", owner, err)
	}
	return u, nil
}

// encodeAttachment stores everything but ID, which is in the key.
func encodeAttachment(a store.Attachment) []byte {
	e := newEncoder(96 + len(a.Owner) + len(a.Device) + len(a.MediaType) + len(a.Name) + len(a.BlobUpload) + len(a.HashState) + len(a.RefClientMsgID))
	e.string(a.Owner)
	e.string(a.Device)
	e.uvarint(a.ConvID)
	e.varint(a.Size)
	e.b = append(e.b, a.SHA256[:]...)
	e.string(a.MediaType)
	e.string(a.Name)
	e.byte(byte(a.State))
	e.varint(a.CreatedAt)
	e.varint(a.ExpiresAt)
	e.string(a.BlobUpload)
	e.varint(a.PartSize)
	e.uvarint(uint64(a.Received))
	e.string(string(a.HashState))
	e.uvarint(uint64(a.Width))
	e.uvarint(uint64(a.Height))
	e.byte(a.Thumb)
	e.string(a.RefClientMsgID)
	e.uvarint(a.RefSeq)
	return e.bytes()
}

// maxAttachInt bounds the counts of a record (received, width, height)
// so that they fit an int everywhere.
const maxAttachInt = 1 << 31

func decodeAttachment(id uint64, b []byte) (store.Attachment, error) {
	d := newDecoder(b)
	if d.err == nil && d.version != codecV2 {
		d.fail() // written as version 2 from the start
	}
	a := store.Attachment{ID: id}
	a.Owner = d.string()
	a.Device = d.string()
	a.ConvID = d.uvarint()
	a.Size = d.varint()
	if d.err == nil && len(d.b) < len(a.SHA256) {
		d.fail()
	}
	if d.err == nil {
		copy(a.SHA256[:], d.b)
		d.b = d.b[len(a.SHA256):]
	}
	a.MediaType = d.string()
	a.Name = d.string()
	a.State = store.AttachState(d.byte())
	if d.err == nil && (a.State < store.AttachUploading || a.State > store.AttachDeleting) {
		d.fail()
	}
	a.CreatedAt = d.varint()
	a.ExpiresAt = d.varint()
	a.BlobUpload = d.string()
	a.PartSize = d.varint()
	received := d.uvarint()
	if hs := d.string(); hs != "" {
		a.HashState = []byte(hs)
	}
	width, height := d.uvarint(), d.uvarint()
	if d.err == nil && (received >= maxAttachInt || width >= maxAttachInt || height >= maxAttachInt) {
		d.fail()
	}
	a.Received, a.Width, a.Height = int(received), int(width), int(height)
	a.Thumb = d.byte()
	if d.err == nil && a.Thumb > store.ThumbRefused {
		d.fail()
	}
	a.RefClientMsgID = d.string()
	a.RefSeq = d.uvarint()
	if err := d.finish("attachment"); err != nil {
		return store.Attachment{}, err
	}
	return a, nil
}

func encodeUsage(u store.Usage) []byte {
	e := newEncoder(16)
	e.varint(u.Bytes)
	e.uvarint(uint64(u.Inflight))
	return e.bytes()
}

func decodeUsage(b []byte) (store.Usage, error) {
	d := newDecoder(b)
	if d.err == nil && d.version != codecV2 {
		d.fail()
	}
	var u store.Usage
	u.Bytes = d.varint()
	n := d.uvarint()
	if d.err == nil && n >= maxAttachInt {
		d.fail()
	}
	u.Inflight = int(n)
	if err := d.finish("attachment usage"); err != nil {
		return store.Usage{}, err
	}
	return u, nil
}
