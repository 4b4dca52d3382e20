package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// attachment returns an uploading record of owner in conv.
func attachment(id uint64, owner string, conv uint64, size int64) store.Attachment {
	return store.Attachment{
		ID: id, Owner: owner, Device: "phone", ConvID: conv, Size: size,
		SHA256: [32]byte{byte(id), 0xab, 31: byte(id >> 8)}, MediaType: "image/png", Name: fmt.Sprintf("file %d.png", id),
		State: store.AttachUploading, CreatedAt: baseTime, ExpiresAt: baseTime + 86_400_000,
		BlobUpload: fmt.Sprintf("upload-%d", id), PartSize: 8 << 20,
	}
}

// sameAttachment compares records; a nil and an empty HashState are equal.
func sameAttachment(a, b store.Attachment) bool {
	if !bytes.Equal(a.HashState, b.HashState) {
		return false
	}
	a.HashState, b.HashState = nil, nil
	return reflect.DeepEqual(a, b)
}

const (
	noQuota    = int64(1) << 62
	noInflight = 1 << 20
)

func (e *env) create(t *testing.T, a store.Attachment) {
	t.Helper()
	if err := e.s.CreateAttachment(context.Background(), a, noQuota, noInflight); err != nil {
		t.Fatalf("CreateAttachment(%d): %v", a.ID, err)
	}
}

func (e *env) wantUsage(t *testing.T, owner string, want store.Usage) {
	t.Helper()
	got, err := e.s.AttachmentUsage(context.Background(), owner)
	if err != nil || got != want {
		t.Fatalf("AttachmentUsage(%s) = %+v, %v; want %+v", owner, got, err, want)
	}
}

func (e *env) wantAttachment(t *testing.T, want store.Attachment) {
	t.Helper()
	got, err := e.s.Attachment(context.Background(), want.ID)
	if err != nil || !sameAttachment(got, want) {
		t.Fatalf("Attachment(%d) = %+v, %v;\nwant %+v", want.ID, got, err, want)
	}
}

// testAttachments: a record reads back as created and as each update left
// it; an update is a compare-and-set on (State, Received); a deleted record
// is gone and deleting it again is no error; the records survive a reopen.
func testAttachments(t *testing.T, e *env) {
	ctx := context.Background()
	s := e.s
	if _, err := s.Attachment(ctx, 1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Attachment of nothing: %v, want ErrNotFound", err)
	}
	e.wantUsage(t, "alice", store.Usage{})
	a := attachment(1, "alice", 10, 20<<20)
	e.create(t, a)
	e.wantAttachment(t, a)
	other := a
	other.Owner = "bob"
	wantErr(t, "CreateAttachment of a taken id", s.CreateAttachment(ctx, other, noQuota, noInflight), store.ErrExists)
	e.wantUsage(t, "bob", store.Usage{})
	e.wantUsage(t, "alice", store.Usage{Bytes: 20 << 20, Inflight: 1})

	// Parts arrive: received and the hash state move on.
	prev := a
	for n := 1; n <= 3; n++ {
		next := prev
		next.Received, next.HashState = n, []byte(fmt.Sprintf("state after %d", n))
		if err := s.UpdateAttachment(ctx, next, prev); err != nil {
			t.Fatalf("UpdateAttachment(received %d): %v", n, err)
		}
		prev = next
	}
	e.wantAttachment(t, prev)
	// A writer that read before the last part lost the race.
	stale := prev
	stale.Received = 2
	lost := prev
	lost.Received = 3
	lost.HashState = []byte("another")
	wantErr(t, "UpdateAttachment with a stale received", s.UpdateAttachment(ctx, lost, stale), store.ErrConflict)
	staleState := prev
	staleState.State = store.AttachComplete
	lostDone := staleState
	lostDone.State = store.AttachAttached
	wantErr(t, "UpdateAttachment with a stale state", s.UpdateAttachment(ctx, lostDone, staleState), store.ErrConflict)
	e.wantAttachment(t, prev)

	// Complete, then attached to a message.
	done := prev
	done.State, done.HashState, done.BlobUpload = store.AttachComplete, nil, ""
	done.Width, done.Height, done.Thumb = 640, 480, store.ThumbPending
	if err := s.UpdateAttachment(ctx, done, prev); err != nil {
		t.Fatalf("UpdateAttachment(complete): %v", err)
	}
	e.wantUsage(t, "alice", store.Usage{Bytes: 20 << 20})
	att := done
	att.State, att.ExpiresAt, att.RefClientMsgID, att.Thumb = store.AttachAttached, 0, "c-1", store.ThumbReady
	if err := s.UpdateAttachment(ctx, att, done); err != nil {
		t.Fatalf("UpdateAttachment(attached): %v", err)
	}
	seq := att
	seq.RefSeq = 17
	if err := s.UpdateAttachment(ctx, seq, att); err != nil {
		t.Fatalf("UpdateAttachment(ref seq): %v", err)
	}
	e.wantAttachment(t, seq)
	e.reopen(t)
	s = e.s
	e.wantAttachment(t, seq)
	e.wantUsage(t, "alice", store.Usage{Bytes: 20 << 20})

	missing := attachment(2, "alice", 10, 1)
	wantErr(t, "UpdateAttachment of nothing", s.UpdateAttachment(ctx, missing, missing), store.ErrNotFound)
	if err := s.DeleteAttachment(ctx, 1); err != nil {
		t.Fatalf("DeleteAttachment: %v", err)
	}
	if _, err := s.Attachment(ctx, 1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Attachment after delete: %v, want ErrNotFound", err)
	}
	if err := s.DeleteAttachment(ctx, 1); err != nil {
		t.Fatalf("DeleteAttachment again: %v", err)
	}
	wantErr(t, "UpdateAttachment after delete", s.UpdateAttachment(ctx, seq, seq), store.ErrNotFound)
	e.wantUsage(t, "alice", store.Usage{})
	// The id is free again.
	e.create(t, a)
	e.wantAttachment(t, a)
}

// testAttachmentQuota: CreateAttachment refuses past the byte quota and the
// in-flight bound and then stores nothing; leaving uploading frees an
// in-flight slot but keeps the bytes; deleting frees what the record held.
func testAttachmentQuota(t *testing.T, e *env) {
	ctx := context.Background()
	s := e.s
	const quota = 1000
	create := func(id uint64, size int64, inflight int) error {
		return s.CreateAttachment(ctx, attachment(id, "alice", 1, size), quota, inflight)
	}
	if err := create(1, 400, 2); err != nil {
		t.Fatal(err)
	}
	if err := create(2, 600, 2); err != nil {
		t.Fatalf("create up to the quota exactly: %v", err)
	}
	wantErr(t, "a byte past the quota", create(3, 1, 5), store.ErrQuota)
	if _, err := s.Attachment(ctx, 3); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused record is stored: %v", err)
	}
	if err := s.DeleteAttachment(ctx, 2); err != nil {
		t.Fatal(err)
	}
	e.wantUsage(t, "alice", store.Usage{Bytes: 400, Inflight: 1})
	if err := create(3, 0, 2); err != nil {
		t.Fatalf("an empty file: %v", err)
	}
	wantErr(t, "a third upload in flight", create(4, 1, 2), store.ErrInflight)
	if _, err := s.Attachment(ctx, 4); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused record is stored: %v", err)
	}
	e.wantUsage(t, "alice", store.Usage{Bytes: 400, Inflight: 2})
	// Another owner has its own share.
	if err := s.CreateAttachment(ctx, attachment(5, "bob", 1, quota), quota, 1); err != nil {
		t.Fatalf("bob's first upload: %v", err)
	}
	e.wantUsage(t, "bob", store.Usage{Bytes: quota, Inflight: 1})

	// Completing one frees a slot, not its bytes.
	one := attachment(1, "alice", 1, 400)
	done := one
	done.State = store.AttachComplete
	if err := s.UpdateAttachment(ctx, done, one); err != nil {
		t.Fatal(err)
	}
	e.wantUsage(t, "alice", store.Usage{Bytes: 400, Inflight: 1})
	if err := create(4, 100, 2); err != nil {
		t.Fatalf("after a completion: %v", err)
	}
	// Later state changes leave the in-flight count alone.
	del := done
	del.State, del.ExpiresAt = store.AttachDeleting, 0
	if err := s.UpdateAttachment(ctx, del, done); err != nil {
		t.Fatal(err)
	}
	e.wantUsage(t, "alice", store.Usage{Bytes: 500, Inflight: 2})
	// An uploading record straight to deleting frees its slot too.
	four := attachment(4, "alice", 1, 100)
	fourDel := four
	fourDel.State = store.AttachDeleting
	if err := s.UpdateAttachment(ctx, fourDel, four); err != nil {
		t.Fatal(err)
	}
	e.wantUsage(t, "alice", store.Usage{Bytes: 500, Inflight: 1})
	for _, id := range []uint64{1, 3, 4} {
		if err := s.DeleteAttachment(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	e.wantUsage(t, "alice", store.Usage{})
	e.reopen(t)
	e.wantUsage(t, "bob", store.Usage{Bytes: quota, Inflight: 1})
	e.wantUsage(t, "alice", store.Usage{})
}

// testAttachmentQuotaRace: creates racing for one owner's quota and
// in-flight bound never pass them together.
func testAttachmentQuotaRace(t *testing.T, e *env) {
	ctx := context.Background()
	const (
		writers = 8
		each    = 4
		size    = 100
		quota   = 10 * size // ten of the 32 fit
	)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := uint64(1 + w*each + i)
				err := e.s.CreateAttachment(ctx, attachment(id, "alice", 1, size), quota, 1000)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, store.ErrQuota):
					refused.Add(1)
				default:
					t.Errorf("CreateAttachment(%d): %v", id, err)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 || refused.Load() != writers*each-10 {
		t.Fatalf("%d created, %d refused; want 10 and %d", ok.Load(), refused.Load(), writers*each-10)
	}
	e.wantUsage(t, "alice", store.Usage{Bytes: quota, Inflight: 10})

	// The in-flight bound the same way, with deletes freeing slots.
	var inflightOK atomic.Int64
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint64(1000 + w)
			err := e.s.CreateAttachment(ctx, attachment(id, "bob", 1, 1), noQuota, 3)
			switch {
			case err == nil:
				inflightOK.Add(1)
			case !errors.Is(err, store.ErrInflight):
				t.Errorf("CreateAttachment(%d): %v", id, err)
			}
		}()
	}
	wg.Wait()
	if inflightOK.Load() != 3 {
		t.Fatalf("%d uploads in flight created, want 3", inflightOK.Load())
	}
	e.wantUsage(t, "bob", store.Usage{Bytes: 3, Inflight: 3})
}

// testAttachmentLists: ConvAttachments pages one conversation's records by
// id; DueAttachments lists the expired, the deleting and the pending
// thumbnails, and follows updates and deletes.
func testAttachmentLists(t *testing.T, e *env) {
	ctx := context.Background()
	s := e.s
	const n = 25
	for i := uint64(1); i <= n; i++ {
		e.create(t, attachment(i*10, "alice", 1+i%2, 1)) // odd i in conv 2
	}
	var all []uint64
	for after := uint64(0); ; {
		page, err := s.ConvAttachments(ctx, 1, after, 4)
		if err != nil {
			t.Fatalf("ConvAttachments(1, %d): %v", after, err)
		}
		if len(page) > 4 {
			t.Fatalf("a page of %d, limit 4", len(page))
		}
		if len(page) == 0 {
			break
		}
		for _, a := range page {
			if a.ConvID != 1 {
				t.Fatalf("record %d of conv %d in conv 1's listing", a.ID, a.ConvID)
			}
			all = append(all, a.ID)
		}
		after = page[len(page)-1].ID
	}
	var want []uint64
	for i := uint64(2); i <= n; i += 2 {
		want = append(want, i*10)
	}
	if !equalSeqs(all, want) {
		t.Fatalf("ConvAttachments paged %v, want %v", all, want)
	}
	page, err := s.ConvAttachments(ctx, 2, 30, 2)
	if err != nil || len(page) != 2 || page[0].ID != 50 || page[1].ID != 70 {
		t.Fatalf("ConvAttachments(2, after 30, 2) = %v, %v; want 50, 70", page, err)
	}
	if !sameAttachment(page[0], attachment(50, "alice", 2, 1)) {
		t.Fatalf("listed record %+v, want as created", page[0])
	}
	if page, err := s.ConvAttachments(ctx, 3, 0, 10); err != nil || len(page) != 0 {
		t.Fatalf("ConvAttachments of an empty conversation = %v, %v", page, err)
	}

	due := func(now int64, limit int) []uint64 {
		t.Helper()
		got, err := e.s.DueAttachments(ctx, now, limit)
		if err != nil {
			t.Fatalf("DueAttachments(%d): %v", now, err)
		}
		ids := make([]uint64, len(got))
		for i, a := range got {
			ids[i] = a.ID
		}
		slices.Sort(ids)
		return ids
	}
	// Every record expires at baseTime+1d.
	if got := due(baseTime, store.MaxAttachPage); len(got) != 0 {
		t.Fatalf("due before any expiry: %v", got)
	}
	if got := due(baseTime+86_400_000, 1000); len(got) != n {
		t.Fatalf("due at the expiry: %d records, want %d", len(got), n)
	}
	if got := due(baseTime+86_400_000, 7); len(got) != 7 {
		t.Fatalf("due with limit 7: %d records", len(got))
	}
	// Attach all but three: attached records are never due by time.
	for i := uint64(1); i <= n; i++ {
		a := attachment(i*10, "alice", 1+i%2, 1)
		next := a
		switch i {
		case 1:
			next.State, next.ExpiresAt = store.AttachDeleting, 0
		case 2:
			next.State, next.ExpiresAt, next.Thumb = store.AttachAttached, 0, store.ThumbPending
		case 3:
			next.State, next.ExpiresAt = store.AttachComplete, baseTime+2*86_400_000
		default:
			next.State, next.ExpiresAt, next.Thumb = store.AttachAttached, 0, store.ThumbReady
		}
		if err := s.UpdateAttachment(ctx, next, a); err != nil {
			t.Fatalf("UpdateAttachment(%d): %v", a.ID, err)
		}
	}
	if got, want := due(baseTime, 100), []uint64{10, 20}; !equalSeqs(got, want) {
		t.Fatalf("due now: %v, want %v (deleting, thumbnail pending)", got, want)
	}
	if got, want := due(baseTime+2*86_400_000, 100), []uint64{10, 20, 30}; !equalSeqs(got, want) {
		t.Fatalf("due later: %v, want %v", got, want)
	}
	if got := due(baseTime-1, 100); len(got) != 0 {
		t.Fatalf("due before the records were created: %v, want none", got)
	}
	if err := s.DeleteAttachment(ctx, 10); err != nil {
		t.Fatal(err)
	}
	ready := attachment(20, "alice", 1, 1)
	ready.State, ready.ExpiresAt, ready.Thumb = store.AttachAttached, 0, store.ThumbPending
	done := ready
	done.Thumb = store.ThumbReady
	if err := s.UpdateAttachment(ctx, done, ready); err != nil {
		t.Fatal(err)
	}
	e.reopen(t)
	if got, want := due(baseTime+2*86_400_000, 100), []uint64{30}; !equalSeqs(got, want) {
		t.Fatalf("due after delete and thumbnail: %v, want %v", got, want)
	}
	if page, err := e.s.ConvAttachments(ctx, 2, 0, store.MaxAttachPage); err != nil || len(page) != (n+1)/2-1 {
		t.Fatalf("ConvAttachments(2) after a delete: %d records, %v; want %d", len(page), err, (n+1)/2-1)
	}
}

// testAttachmentMessage: a message's Attachment is stored by Append and read
// back by every read and by a duplicate; an edit's Check keeps it, a
// recall's Check clears it.
func testAttachmentMessage(t *testing.T, e *env) {
	ctx := context.Background()
	e.group(t, 1, "alice", "bob")
	e.send(t, 1, "bob", 1)
	m := e.msg(1, "alice", "file-1", `{"name":"cat.png"}`)
	m.Kind, m.Attachment = "file", 1<<50|7
	res, err := e.s.Append(ctx, store.Append{Msg: m})
	if err != nil {
		t.Fatalf("Append(file): %v", err)
	}
	if res.Msg.Attachment != m.Attachment {
		t.Fatalf("Append returned attachment %d, want %d", res.Msg.Attachment, m.Attachment)
	}
	want := res.Msg
	e.send(t, 1, "bob", 1)
	check := func(what string, want store.Message) {
		t.Helper()
		msgs, err := e.s.Messages(ctx, 1, 2, 2, 10)
		if err != nil || len(msgs) != 1 || !sameMsg(msgs[0], want) {
			t.Fatalf("%s: Messages(2) = %+v, %v;\nwant %+v", what, msgs, err, want)
		}
		latest, err := e.s.Latest(ctx, 1, 0, 0, 10)
		if err != nil || len(latest) < 3 || !sameMsg(latest[1], want) || latest[0].Attachment != 0 || latest[2].Attachment != 0 {
			t.Fatalf("%s: Latest = %+v, %v;\nwant %+v at seq 2 and no attachment elsewhere", what, latest, err, want)
		}
	}
	check("stored", want)
	retry := m
	retry.MsgID = e.msg(1, "alice", "", "").MsgID // through another node
	dup, err := e.s.Append(ctx, store.Append{Msg: retry})
	if err != nil || !dup.Duplicate || dup.Msg.Attachment != m.Attachment {
		t.Fatalf("Append(duplicate) = %+v, %v; want the original with its attachment", dup, err)
	}
	e.reopen(t)
	check("after reopen", want)

	var seen store.Message
	ev := e.msg(1, "alice", "", "")
	ev.Kind, ev.TargetSeq = "edit", 2
	if _, err := e.s.Append(ctx, store.Append{Msg: ev, Check: func(target store.Message) (store.Message, error) {
		seen = target
		target.Body, target.Edited = `{"name":"cat.png","caption":"hi"}`, true
		return target, nil
	}}); err != nil {
		t.Fatalf("Append(edit): %v", err)
	}
	if seen.Attachment != m.Attachment {
		t.Fatalf("Check saw attachment %d, want %d", seen.Attachment, m.Attachment)
	}
	want.Body, want.Edited = `{"name":"cat.png","caption":"hi"}`, true
	check("edited", want)

	rc := e.msg(1, "alice", "", "")
	rc.Kind, rc.TargetSeq = "recall", 2
	if _, err := e.s.Append(ctx, store.Append{Msg: rc, Check: func(target store.Message) (store.Message, error) {
		target.Body, target.Recalled, target.Edited, target.Attachment = "", true, false, 0
		return target, nil
	}}); err != nil {
		t.Fatalf("Append(recall): %v", err)
	}
	want.Body, want.Recalled, want.Edited, want.Attachment = "", true, false, 0
	check("recalled", want)
	e.reopen(t)
	check("recalled, after reopen", want)
}

// testAttachmentBadArguments: the seam refuses records it cannot store
// (with no sentinel), listings out of bounds, and updates that change what
// never changes; lookups of invalid ids find nothing.
func testAttachmentBadArguments(t *testing.T, e *env) {
	ctx := context.Background()
	s := e.s
	ok := attachment(1, "alice", 1, 10)
	e.create(t, ok)
	edit := func(f func(*store.Attachment)) store.Attachment {
		a := attachment(2, "alice", 1, 10)
		f(&a)
		return a
	}
	long := func(n int) string { return string(bytes.Repeat([]byte{'x'}, n)) }
	badRecords := map[string]store.Attachment{
		"id 0":             edit(func(a *store.Attachment) { a.ID = 0 }),
		"invalid owner":    edit(func(a *store.Attachment) { a.Owner = bad }),
		"invalid device":   edit(func(a *store.Attachment) { a.Device = bad }),
		"negative size":    edit(func(a *store.Attachment) { a.Size = -1 }),
		"long name":        edit(func(a *store.Attachment) { a.Name = long(store.MaxAttachNameBytes + 1) }),
		"long media type":  edit(func(a *store.Attachment) { a.MediaType = long(store.MaxAttachMediaBytes + 1) }),
		"long hash state":  edit(func(a *store.Attachment) { a.HashState = []byte(long(store.MaxAttachHashState + 1)) }),
		"state 0":          edit(func(a *store.Attachment) { a.State = 0 }),
		"unknown state":    edit(func(a *store.Attachment) { a.State = store.AttachDeleting + 1 }),
		"unknown thumb":    edit(func(a *store.Attachment) { a.Thumb = store.ThumbRefused + 1 }),
		"created complete": edit(func(a *store.Attachment) { a.State = store.AttachComplete }),
	}
	sentinels := []error{store.ErrNotFound, store.ErrExists, store.ErrConflict, store.ErrQuota, store.ErrInflight, store.ErrClosed}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: accepted", what)
			return
		}
		for _, s := range sentinels {
			if errors.Is(err, s) {
				t.Errorf("%s: %v, want an error that is no sentinel", what, err)
			}
		}
	}
	for name, a := range badRecords {
		refused("CreateAttachment "+name, s.CreateAttachment(ctx, a, noQuota, noInflight))
	}
	refused("CreateAttachment negative quota", s.CreateAttachment(ctx, attachment(2, "alice", 1, 10), -1, 1))
	if _, err := s.Attachment(ctx, 2); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused record is stored: %v", err)
	}
	// Updates: the same checks, and what never changes.
	for name, a := range badRecords {
		if name == "created complete" || name == "id 0" {
			continue
		}
		a.ID = 1
		refused("UpdateAttachment "+name, s.UpdateAttachment(ctx, a, ok))
	}
	changes := map[string]func(*store.Attachment){
		"owner":        func(a *store.Attachment) { a.Owner = "bob" },
		"conversation": func(a *store.Attachment) { a.ConvID = 2 },
		"size":         func(a *store.Attachment) { a.Size = 11 },
		"created at":   func(a *store.Attachment) { a.CreatedAt++ },
	}
	for name, f := range changes {
		next := ok
		f(&next)
		refused("UpdateAttachment changing the "+name, s.UpdateAttachment(ctx, next, ok))
	}
	other := ok
	other.ID = 3
	refused("UpdateAttachment with prev of another record", s.UpdateAttachment(ctx, ok, other))
	done := ok
	done.State = store.AttachComplete
	if err := s.UpdateAttachment(ctx, done, ok); err != nil {
		t.Fatal(err)
	}
	refused("UpdateAttachment back to uploading", s.UpdateAttachment(ctx, ok, done))
	e.wantAttachment(t, done)
	e.wantUsage(t, "alice", store.Usage{Bytes: 10})

	for _, limit := range []int{0, -1, store.MaxAttachPage + 1} {
		_, err := s.ConvAttachments(ctx, 1, 0, limit)
		refused(fmt.Sprintf("ConvAttachments limit %d", limit), err)
		_, err = s.DueAttachments(ctx, baseTime, limit)
		refused(fmt.Sprintf("DueAttachments limit %d", limit), err)
	}
	if _, err := s.Attachment(ctx, 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Attachment(0): %v, want ErrNotFound", err)
	}
	if err := s.DeleteAttachment(ctx, 0); err != nil {
		t.Errorf("DeleteAttachment(0): %v", err)
	}
	if u, err := s.AttachmentUsage(ctx, bad); err != nil || u != (store.Usage{}) {
		t.Errorf("AttachmentUsage(invalid) = %+v, %v; want zero", u, err)
	}
	if page, err := s.ConvAttachments(ctx, 1, ^uint64(0), 10); err != nil || len(page) != 0 {
		t.Errorf("ConvAttachments after the last id = %v, %v", page, err)
	}
}
