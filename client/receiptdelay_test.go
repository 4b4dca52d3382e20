package client

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
)

// TestDirectReceiptDelayFigures measures, in a direct conversation, the
// delay from the push reaching the receiver's application to the sender's
// delivered receipt for it (the receiver's SDK acknowledges, the server
// sends the receipt). A measurement for docs/benchmarks.md, run with
// PARLEY_RECEIPT_FIGURES=1; it prints figures and checks only that every
// receipt came.
func TestDirectReceiptDelayFigures(t *testing.T) {
	if os.Getenv("PARLEY_RECEIPT_FIGURES") == "" {
		t.Skip("a measurement: set PARLEY_RECEIPT_FIGURES=1")
	}
	srv := servertest.Start(t)
	alice := startE2E(t, srv.URL, srv.Token("alice"), "d1", nil)
	bob := startE2E(t, srv.URL, srv.Token("bob"), "d1", nil)
	ctx := ctxT(t)
	conv, err := alice.OpenDirect(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	var seqs []uint64
	for i := range n {
		a, err := alice.Send(ctx, conv.ConvID, fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, a.Seq)
		time.Sleep(150 * time.Millisecond) // each receipt on its own
	}
	last := seqs[len(seqs)-1]
	eventually(t, "every receipt", func() bool { return alice.rec.receipt("bob", "d1", "delivered", last) })
	pushed := map[uint64]time.Time{}
	evs, at := bob.rec.all(EventMessage)
	for i, ev := range evs {
		if ev.ConvID == conv.ConvID {
			pushed[ev.Message.Seq] = at[i]
		}
	}
	var delays []time.Duration
	revs, rat := alice.rec.all(EventReceipt)
	for i, ev := range revs {
		if p, ok := pushed[ev.Receipt.Seq]; ok && ev.Receipt.State == "delivered" && ev.Receipt.UserID == "bob" {
			delays = append(delays, rat[i].Sub(p))
		}
	}
	slices.Sort(delays)
	if len(delays) < n/2 {
		t.Fatalf("%d receipts for %d messages", len(delays), n)
	}
	t.Logf("direct delivered receipts: %d; push to receipt p50 %v, p90 %v, max %v",
		len(delays), delays[len(delays)/2], delays[len(delays)*9/10], delays[len(delays)-1])
}
