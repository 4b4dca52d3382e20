package memory

import (
	"context"
	"fmt"
	"testing"

	"github.com/parley-im/parley/internal/registry"
)

// TestLookupResultsStayAsReturned: Lookup shares the stored slices, so no
// later change may modify a slice already handed out.
func TestLookupResultsStayAsReturned(t *testing.T) {
	ctx := context.Background()
	r := New()
	reg := func(dev, node, sess string) {
		if _, err := r.Register(ctx, registry.Entry{User: "u", Device: dev, Node: node, Session: sess}); err != nil {
			t.Fatal(err)
		}
	}
	reg("d1", "n1", "s1")
	reg("d2", "n2", "s2")
	reg("d3", "n1", "s3")
	got, _ := r.Lookup(ctx, []string{"u"})
	before := fmt.Sprint(got["u"])
	reg("d2", "n3", "s4") // replaces d2
	reg("d4", "n1", "s5") // appends
	if err := r.Unregister(ctx, "u", "d1", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := r.DropNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if after := fmt.Sprint(got["u"]); after != before {
		t.Fatalf("a returned slice changed: %s, was %s", after, before)
	}
	now, _ := r.Lookup(ctx, []string{"u"})
	if len(now["u"]) != 1 || now["u"][0].Device != "d2" || now["u"][0].Node != "n3" {
		t.Fatalf("now %+v, want only d2 on n3", now["u"])
	}
}
