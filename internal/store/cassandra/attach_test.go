package cassandra

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
)

func testAttachment(id uint64, owner string, size int64) store.Attachment {
	return store.Attachment{ID: id, Owner: owner, Device: "phone", ConvID: 1, Size: size, MediaType: "text/plain",
		Name: fmt.Sprintf("f%d", id), State: store.AttachUploading, CreatedAt: baseTime, ExpiresAt: baseTime + 1000}
}

// TestAttachmentQuotaTwoProcesses: two Stores on one keyspace (two chat
// processes, each its own session) create one owner's records at once;
// the usage's compare-and-set lets exactly as many through as the quota
// and the in-flight bound allow, and the usage adds up to the records
// stored. Then they complete and delete them at once, back to zero.
func TestAttachmentQuotaTwoProcesses(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	procs := []*Store{openT(t, cfg), openT(t, cfg)}
	const (
		workers = 6 // per process
		each    = 5
		size    = 10
		fit     = 17 // of 60
		quota   = fit * size
	)
	var (
		ids     atomic.Uint64
		created atomic.Int64
		mu      sync.Mutex
		stored  []store.Attachment
		wg      sync.WaitGroup
	)
	for p, s := range procs {
		for range workers {
			wg.Go(func() {
				for range each {
					a := testAttachment(ids.Add(1), "alice", size)
					err := s.CreateAttachment(ctx, a, quota, 1000)
					switch {
					case err == nil:
						created.Add(1)
						mu.Lock()
						stored = append(stored, a)
						mu.Unlock()
					case !errors.Is(err, store.ErrQuota):
						t.Errorf("process %d: create %d: %v", p, a.ID, err)
					}
				}
			})
		}
	}
	wg.Wait()
	if created.Load() != fit {
		t.Fatalf("%d records created, want %d (quota %d, %d bytes each)", created.Load(), fit, quota, size)
	}
	u, err := procs[1].AttachmentUsage(ctx, "alice")
	if err != nil || u != (store.Usage{Bytes: quota, Inflight: fit}) {
		t.Fatalf("usage = %+v, %v; want %d bytes, %d in flight", u, err, quota, fit)
	}
	// The in-flight bound, racing the same way.
	var inflight atomic.Int64
	for p, s := range procs {
		for w := range workers {
			wg.Go(func() {
				a := testAttachment(uint64(10_000+p*100+w), "bob", 1)
				switch err := s.CreateAttachment(ctx, a, 1<<40, 4); {
				case err == nil:
					inflight.Add(1)
				case !errors.Is(err, store.ErrInflight):
					t.Errorf("process %d: create %d: %v", p, a.ID, err)
				}
			})
		}
	}
	wg.Wait()
	if inflight.Load() != 4 {
		t.Fatalf("%d uploads of bob in flight created, want 4", inflight.Load())
	}
	// Completions and deletes from both processes at once.
	for i, a := range stored {
		wg.Go(func() {
			s := procs[i%2]
			done := a
			done.State = store.AttachComplete
			if err := s.UpdateAttachment(ctx, done, a); err != nil {
				t.Errorf("complete %d: %v", a.ID, err)
				return
			}
			if i%3 == 0 {
				return
			}
			if err := procs[(i+1)%2].DeleteAttachment(ctx, a.ID); err != nil {
				t.Errorf("delete %d: %v", a.ID, err)
			}
		})
	}
	wg.Wait()
	kept := int64(0)
	for i := range stored {
		if i%3 == 0 {
			kept++
		}
	}
	u, err = procs[0].AttachmentUsage(ctx, "alice")
	if err != nil || u != (store.Usage{Bytes: kept * size}) {
		t.Fatalf("usage after completions and deletes = %+v, %v; want %d bytes, none in flight", u, err, kept*size)
	}
}

// TestAttachmentStaleIndex: listing rows without a record (a create that
// died between them and its transaction) are skipped by both listings,
// and DueAttachments deletes a stale due row once it is old enough and
// then the empty bucket's index row.
func TestAttachmentStaleIndex(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	s := openT(t, cfg)
	a := testAttachment(7, "alice", 1)
	// What a create leaves before its transaction.
	if err := s.q(ctx, `INSERT INTO attachments_by_conv (conv_id, id, owner) VALUES (?, ?, ?)`, int64(1), int64(7), "alice").Exec(); err != nil {
		t.Fatal(err)
	}
	if err := s.addDue(ctx, a.ID, a.Owner, dueOf(a)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ConvAttachments(ctx, 1, 0, 10); err != nil || len(got) != 0 {
		t.Fatalf("ConvAttachments = %v, %v; want none", got, err)
	}
	if got, err := s.DueAttachments(ctx, baseTime+5000, 10); err != nil || len(got) != 0 {
		t.Fatalf("DueAttachments = %v, %v; want none", got, err)
	}
	rows := func() (due, buckets int) {
		t.Helper()
		if err := s.q(ctx, `SELECT COUNT(*) FROM attachments_due`).Scan(&due); err != nil {
			t.Fatal(err)
		}
		if err := s.q(ctx, `SELECT COUNT(*) FROM attachments_due_buckets`).Scan(&buckets); err != nil {
			t.Fatal(err)
		}
		return due, buckets
	}
	if due, buckets := rows(); due != 1 || buckets != 1 {
		t.Fatalf("a young stale row: %d due rows, %d buckets; want it kept (a write may be in progress)", due, buckets)
	}
	// A row written more than dueGrace ago, alone in another bucket.
	b := testAttachment(9, "alice", 1)
	b.CreatedAt, b.ExpiresAt = baseTime+3*dueBucketMS, baseTime+3*dueBucketMS+1
	old := time.Now().Add(-2 * dueGrace).UnixMicro()
	if err := s.q(ctx, `INSERT INTO attachments_due (shard, bucket, due, id, owner) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?`,
		dueShard(9), dueOf(b)/dueBucketMS, dueOf(b), int64(9), "alice", old).Exec(); err != nil {
		t.Fatal(err)
	}
	if err := s.q(ctx, `INSERT INTO attachments_due_buckets (shard, bucket) VALUES (?, ?) USING TIMESTAMP ?`,
		dueShard(9), dueOf(b)/dueBucketMS, old).Exec(); err != nil {
		t.Fatal(err)
	}
	later := b.ExpiresAt + 1
	if got, err := s.DueAttachments(ctx, later, 10); err != nil || len(got) != 0 {
		t.Fatalf("DueAttachments = %v, %v; want none", got, err)
	}
	if due, buckets := rows(); due != 1 || buckets != 2 {
		t.Fatalf("an old stale row: %d due rows, %d buckets left; want the young one only, and both buckets", due, buckets)
	}
	// Its bucket is empty now, and in the past: the next listing prunes it.
	if _, err := s.DueAttachments(ctx, later+dueBucketMS, 10); err != nil {
		t.Fatal(err)
	}
	if _, buckets := rows(); buckets != 1 {
		t.Fatalf("%d index rows, want 1: the empty past bucket pruned", buckets)
	}
	// Records created afterwards, one in the pruned bucket, are listed.
	for _, r := range []store.Attachment{a, b} {
		if err := s.CreateAttachment(ctx, r, 100, 10); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.DueAttachments(ctx, later, 10)
	if err != nil || len(got) != 2 || got[0].ID != 7 || got[1].ID != 9 {
		t.Fatalf("DueAttachments after creates = %v, %v; want records 7 and 9", got, err)
	}
}

// TestAttachmentTransactions bounds the Paxos rounds of each write when
// nothing contends, so that a change cannot add rounds unnoticed.
func TestAttachmentTransactions(t *testing.T) {
	cfg := fresh(t)
	ctx := context.Background()
	s := openT(t, cfg)
	rounds := func(what string, max uint64, f func() error) {
		t.Helper()
		before := s.Transactions()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := s.Transactions() - before; got > max {
			t.Errorf("%s: %d Paxos rounds, want at most %d", what, got, max)
		}
	}
	a := testAttachment(1, "alice", 10)
	rounds("create", 2, func() error { return s.CreateAttachment(ctx, a, 100, 10) }) // the id, the record with the usage
	part := a
	part.Received = 1
	rounds("a part", 1, func() error { return s.UpdateAttachment(ctx, part, a) })
	done := part
	done.State = store.AttachComplete
	rounds("complete", 1, func() error { return s.UpdateAttachment(ctx, done, part) })
	rounds("delete", 1, func() error { return s.DeleteAttachment(ctx, 1) })
}
