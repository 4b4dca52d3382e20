package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// ErrTooFewPoints is returned by Fit when the points cannot define a line.
var ErrTooFewPoints = errors.New("need at least two distinct x values")

// Line is a least-squares fit y = Intercept + Slope·x.
type Line struct {
	Slope     float64
	Intercept float64
}

// Fit returns the least-squares line through the points (xs[i], ys[i]).
// A slope over every checkpoint, rather than (last-first)/n, keeps one
// sample taken mid-GC-cycle from deciding the result.
func Fit(xs, ys []float64) (Line, error) {
	if len(xs) != len(ys) {
		return Line{}, fmt.Errorf("fit: %d x values for %d y values", len(xs), len(ys))
	}
	n := float64(len(xs))
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	if n > 0 {
		mx /= n
		my /= n
	}
	// Centred sums avoid the cancellation of Σx² − n·x̄² when x is large
	// (connection counts) and the spread is small.
	var sxx, sxy float64
	for i := range xs {
		dx := xs[i] - mx
		sxx += dx * dx
		sxy += dx * (ys[i] - my)
	}
	if sxx == 0 || math.IsNaN(sxx) {
		return Line{}, fmt.Errorf("fit: %w", ErrTooFewPoints)
	}
	slope := sxy / sxx
	return Line{Slope: slope, Intercept: my - slope*mx}, nil
}

// Percentile returns the p-th percentile (0 < p ≤ 100) of ds by the
// nearest-rank method: the smallest value with at least p% of the samples at
// or below it. Unlike interpolation it always reports a latency that was
// actually observed. ds need not be sorted and is not modified. It returns 0
// for no samples.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = max(1, min(rank, len(s)))
	return s[rank-1]
}

// Latencies summarises a set of latency samples.
type Latencies struct {
	N             int
	P50, P99, Max time.Duration
}

// Summarize computes the percentiles reported by the benchmarks.
func Summarize(ds []time.Duration) Latencies {
	if len(ds) == 0 {
		return Latencies{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return Latencies{N: len(s), P50: percentileSorted(s, 50), P99: percentileSorted(s, 99), Max: s[len(s)-1]}
}
