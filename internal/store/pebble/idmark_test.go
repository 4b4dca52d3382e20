package pebble

import (
	"context"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/store"
)

// A repeated msg id is refused in its conversation whether the watermark
// lets the append skip the lookup or not: before and after a restart, and
// in a store written before the watermark existed.
func TestMsgIDWatermark(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Dir: "db", FS: vfs.NewMem()}
	s := openT(t, cfg)
	for _, conv := range []uint64{1, 2} {
		if err := s.CreateConversation(ctx, store.Conversation{ID: conv, Kind: store.Group}, []store.Member{{UserID: "a"}}); err != nil {
			t.Fatalf("CreateConversation: %v", err)
		}
	}
	if got := s.idMark.v.Load(); got != 0 {
		t.Fatalf("new store: watermark %d, want 0", got)
	}
	const id = uint64(1000) << 22
	n := 0
	appendID := func(s *Store, conv, msgID uint64) error {
		n++
		m := store.Message{ConvID: conv, MsgID: msgID, Sender: "a", Kind: "text", Body: "x", ServerTime: 1_700_000_000_000,
			ClientMsgID: "c" + string(rune('a'+n))}
		_, err := s.Append(ctx, store.Append{Msg: m})
		return err
	}
	if err := appendID(s, 1, id); err != nil {
		t.Fatalf("Append: %v", err)
	}
	if got := s.idMark.v.Load(); got != id+idMarkMargin {
		t.Fatalf("watermark %d after id %d, want %d", got, id, id+idMarkMargin)
	}
	if err := appendID(s, 1, id); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("same id again: %v, want ErrConflict", err)
	}
	if err := appendID(s, 2, id); err != nil {
		t.Fatalf("same id in another conversation: %v", err)
	}
	// Above the watermark: no lookup, a new watermark.
	far := id + 3*idMarkMargin
	if err := appendID(s, 1, far); err != nil {
		t.Fatalf("Append: %v", err)
	}
	if got := s.idMark.v.Load(); got != far+idMarkMargin {
		t.Fatalf("watermark %d after id %d, want %d", got, far, far+idMarkMargin)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openT(t, cfg)
	if got := s.idMark.v.Load(); got != far+idMarkMargin {
		t.Fatalf("after a restart: watermark %d, want %d", got, far+idMarkMargin)
	}
	for _, taken := range []uint64{id, far} {
		if err := appendID(s, 1, taken); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("after a restart, id %d again: %v, want ErrConflict", taken, err)
		}
	}
	// A store from before the watermark: the stored ids give it.
	if err := s.db.Delete(idMarkKey, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, cfg)
	defer s.Close()
	if got := s.idMark.v.Load(); got != far {
		t.Fatalf("without the N key: watermark %d, want the highest stored id %d", got, far)
	}
	if err := appendID(s, 1, far); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("without the N key, id %d again: %v, want ErrConflict", far, err)
	}
	msgs, err := s.Messages(ctx, 1, 1, 10, 10)
	if err != nil || len(msgs) != 2 || msgs[0].MsgID != id || msgs[1].MsgID != far {
		t.Fatalf("conversation 1 holds %+v, %v; want ids %d and %d", msgs, err, id, far)
	}
}
