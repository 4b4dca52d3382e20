package bench

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestFit(t *testing.T) {
	tests := []struct {
		name          string
		xs, ys        []float64
		slope, interc float64
		wantErr       error
		wantAnyErr    bool
	}{
		{name: "exact line", xs: []float64{0, 3000, 6000, 9000}, ys: []float64{10e6, 19e6, 28e6, 37e6}, slope: 3000, interc: 10e6},
		{name: "noise cancels", xs: []float64{0, 1, 2, 3}, ys: []float64{1, 2, 2, 3}, slope: 0.6, interc: 1.1},
		{name: "flat", xs: []float64{1, 2, 3}, ys: []float64{5, 5, 5}, slope: 0, interc: 5},
		{name: "large x small spread", xs: []float64{1e9, 1e9 + 1, 1e9 + 2}, ys: []float64{0, 2, 4}, slope: 2, interc: -2e9},
		{name: "one point", xs: []float64{1}, ys: []float64{1}, wantErr: ErrTooFewPoints},
		{name: "no points", wantErr: ErrTooFewPoints},
		{name: "same x", xs: []float64{2, 2}, ys: []float64{1, 3}, wantErr: ErrTooFewPoints},
		{name: "length mismatch", xs: []float64{1, 2}, ys: []float64{1}, wantAnyErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Fit(tt.xs, tt.ys)
			if tt.wantErr != nil || tt.wantAnyErr {
				if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
					t.Fatalf("Fit err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Fit: %v", err)
			}
			if !near(got.Slope, tt.slope) || !near(got.Intercept, tt.interc) {
				t.Errorf("Fit = %+v, want slope %v intercept %v", got, tt.slope, tt.interc)
			}
		})
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		// Reversed, so an implementation that forgets to sort fails.
		hundred[i] = time.Duration(100-i) * time.Millisecond
	}
	tests := []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single", ms(7), 99, 7 * time.Millisecond},
		{"median odd", ms(5, 1, 3), 50, 3 * time.Millisecond},
		{"median even takes lower rank", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p99 of 100", hundred, 99, 99 * time.Millisecond},
		{"p100 is max", hundred, 100, 100 * time.Millisecond},
		{"p1 of 100", hundred, 1, 1 * time.Millisecond},
		{"tiny p is min", ms(9, 8, 7), 0.001, 7 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]time.Duration(nil), tt.in...)
			if got := Percentile(tt.in, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.in, tt.p, got, tt.want)
			}
			for i := range before {
				if before[i] != tt.in[i] {
					t.Fatalf("Percentile modified its input")
				}
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 1000; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	got := Summarize(ds)
	want := Latencies{N: 1000, P50: 500 * time.Microsecond, P99: 990 * time.Microsecond, Max: 1000 * time.Microsecond}
	if got != want {
		t.Errorf("Summarize = %+v, want %+v", got, want)
	}
	if got := Summarize(nil); got != (Latencies{}) {
		t.Errorf("Summarize(nil) = %+v, want zero", got)
	}
}
