package attach

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"github.com/parley-im/parley/internal/attach/thumb"
	"github.com/parley-im/parley/internal/store"
)

// Thumbnails are made off the request path, one at a time per process (a
// large image costs a fraction of a second of CPU and up to a few hundred
// MB while it decodes): upload_complete queues them; a queue that is full
// drops the id, and the GC queues a thumbnail left pending (dropped, or
// lost to a crash) again once thumbGrace has passed since its upload
// began.
const (
	thumbQueue   = 256
	thumbWorkers = 1
	thumbGrace   = 2 * time.Minute
	thumbTries   = 5
)

// imageTypes are the media types the server reads dimensions of and
// thumbnails (plain conversations only).
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// probe fills next's dimensions and thumbnail state from the header of
// its file, an image of a plain conversation: pending (to make), or
// refused (over max_image_pixels, or not an image of its declared kind).
func (s *Service) probe(ctx context.Context, next *store.Attachment) {
	r, _, err := s.bs.Open(ctx, FileKey(next.ID), 0, -1)
	if err != nil {
		s.log.Warn("thumbnail: open", "attachment", next.ID, "err", err)
		next.Thumb = store.ThumbPending // the worker tries again
		return
	}
	defer r.Close()
	c, err := thumb.Probe(r)
	switch {
	case err != nil:
		next.Thumb = store.ThumbRefused
	case int64(c.Width)*int64(c.Height) > s.cfg.MaxImagePixels:
		next.Width, next.Height, next.Thumb = c.Width, c.Height, store.ThumbRefused
	default:
		next.Width, next.Height, next.Thumb = c.Width, c.Height, store.ThumbPending
	}
}

// queueThumb queues id's thumbnail unless it is queued already.
func (s *Service) queueThumb(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.queued[id] {
		return
	}
	select {
	case s.thumbs <- id:
		s.mu.queued[id] = true
	default: // full: the GC queues it again later
	}
}

// requeueThumb queues a thumbnail the GC found pending long after its
// upload began.
func (s *Service) requeueThumb(a store.Attachment, now time.Time) {
	if now.Sub(time.UnixMilli(a.CreatedAt)) >= thumbGrace {
		s.queueThumb(a.ID)
	}
}

func (s *Service) thumbWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-s.thumbs:
			s.makeThumb(ctx, id)
			s.mu.Lock()
			delete(s.mu.queued, id)
			s.mu.Unlock()
		}
	}
}

// makeThumb makes and stores attachment id's thumbnail (t/<id>, JPEG) and
// records it ready, or refused when the image cannot be made one of.
func (s *Service) makeThumb(ctx context.Context, id uint64) {
	a, err := s.att.Attachment(ctx, id)
	if err != nil || a.Thumb != store.ThumbPending || a.State == store.AttachDeleting || a.State == store.AttachUploading {
		return
	}
	r, _, err := s.bs.Open(ctx, FileKey(id), 0, -1)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("thumbnail: open", "attachment", id, "err", err)
		}
		return // left pending: the GC queues it again
	}
	jpg, _, _, err := thumb.Make(r, s.cfg.MaxImagePixels, s.cfg.ThumbnailPx)
	r.Close()
	state := store.ThumbReady
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		state = store.ThumbRefused
	} else if err := s.bs.Put(ctx, ThumbKey(id), bytes.NewReader(jpg), int64(len(jpg)), sha256.Sum256(jpg)); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("thumbnail: store", "attachment", id, "err", err)
		}
		return
	}
	// The compare-and-set covers state and parts only: read again right
	// before writing and change nothing but the thumbnail, so that a
	// message attached meanwhile keeps its fields.
	for range thumbTries {
		cur, err := s.att.Attachment(ctx, id)
		if err != nil || cur.Thumb != store.ThumbPending || cur.State == store.AttachDeleting {
			return
		}
		next := cur
		next.Thumb = state
		err = s.att.UpdateAttachment(ctx, next, cur)
		if err == nil || !errors.Is(err, store.ErrConflict) {
			if err != nil && ctx.Err() == nil {
				s.log.Warn("thumbnail: record", "attachment", id, "err", err)
			}
			return
		}
	}
}
