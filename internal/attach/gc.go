package attach

import (
	"context"
	"errors"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// gcPage is how many due records one GC pass reads at a time; gcPages
// bounds the pages of one pass (the rest waits for the next).
const (
	gcPage  = 200
	gcPages = 50
)

// gcLoop runs a GC pass every gc_interval until ctx ends.
func (s *Service) gcLoop(ctx context.Context) {
	tick := time.NewTicker(s.cfg.GCInterval)
	defer tick.Stop()
	for {
		s.GC(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// GC does one pass over the records that need work (store.DueAttachments):
// an expired upload is aborted and deleted, an expired unattached file
// deleted, a record in state deleting has its blobs and then itself
// deleted, and a thumbnail left pending (by a crash, or a full queue) is
// queued again. It returns how many records it deleted. Every chat process runs it; each
// step is idempotent, and a record leaves uploading or complete for
// deleting by a compare-and-set, so a file a message names meanwhile is
// never deleted.
func (s *Service) GC(ctx context.Context) int {
	deleted := 0
	for range gcPages {
		now := s.now()
		due, err := s.att.DueAttachments(ctx, now.UnixMilli(), gcPage)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("attachment GC: due records", "err", err)
			}
			return deleted
		}
		progress := 0
		for _, a := range due {
			if ctx.Err() != nil {
				return deleted
			}
			done, err := s.collect(ctx, a, now)
			switch {
			case err != nil:
				s.log.Warn("attachment GC", "attachment", a.ID, "err", err)
			case done:
				deleted++
				progress++
			}
		}
		// A page of records that stay due (thumbnails pending) would
		// come back the same: the next pass takes them.
		if len(due) < gcPage || progress == 0 {
			return deleted
		}
	}
	return deleted
}

// collect does a's due work; it reports whether a was deleted.
func (s *Service) collect(ctx context.Context, a store.Attachment, now time.Time) (bool, error) {
	expired := a.ExpiresAt > 0 && a.ExpiresAt <= now.UnixMilli()
	switch {
	case a.State == store.AttachDeleting:
	case expired && (a.State == store.AttachUploading || a.State == store.AttachComplete):
		next := a
		next.State, next.ExpiresAt = store.AttachDeleting, 0
		if err := s.att.UpdateAttachment(ctx, next, a); err != nil {
			if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
				return false, nil // completed, attached or deleted meanwhile
			}
			return false, err
		}
		a = next
	default:
		if a.Thumb == store.ThumbPending && (a.State == store.AttachComplete || a.State == store.AttachAttached) {
			s.requeueThumb(a, now)
		}
		return false, nil
	}
	if err := s.remove(ctx, a); err != nil {
		return false, err
	}
	return true, nil
}
