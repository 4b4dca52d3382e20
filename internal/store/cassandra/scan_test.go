package cassandra

import (
	"context"
	"slices"
	"testing"
)

// TestScanConvIDs: every conversation once, across pages, and an error
// of fn ends the scan with it.
func TestScanConvIDs(t *testing.T) {
	cfg := fresh(t)
	s := openT(t, cfg)
	var want []uint64
	for i := uint64(1); i <= 2345; i++ {
		id := i * 7919
		if err := suite.admin.Query(`INSERT INTO conversations (conv_id, last_seq) VALUES (?, 0)`, i64(id)).Exec(); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	ctx := context.Background()
	var got []uint64
	pages := 0
	if err := s.ScanConvIDs(ctx, func(ids []uint64) error {
		pages++
		got = append(got, ids...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) || pages != 3 {
		t.Fatalf("%d ids in %d pages, want %d in 3", len(got), pages, len(want))
	}
	stop := context.Canceled
	if err := s.ScanConvIDs(ctx, func([]uint64) error { return stop }); err != stop {
		t.Fatalf("fn's error: %v", err)
	}
}
