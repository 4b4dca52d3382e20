package cassandra

import (
	"bytes"
	"context"
	"testing"
)

// BenchmarkKTAppend measures key transparency log appends, one after
// another as a log's writer makes them: each a lightweight transaction
// (INSERT … IF NOT EXISTS) of a 300-byte leaf.
func BenchmarkKTAppend(b *testing.B) {
	s := openT(b, fresh(b))
	ctx := context.Background()
	leaf := bytes.Repeat([]byte{1}, 300)
	var i uint64
	for b.Loop() {
		if err := s.KTAppend(ctx, i, leaf); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}
