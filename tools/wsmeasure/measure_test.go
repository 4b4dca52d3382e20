//go:build linux

package main

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestSlope(t *testing.T) {
	tests := []struct {
		name   string
		xs, ys []float64
		want   float64
	}{
		{"exact line", []float64{0, 3000, 6000}, []float64{1e6, 1e6 + 3000*2048, 1e6 + 6000*2048}, 2048},
		{"noisy", []float64{0, 1, 2, 3}, []float64{0, 1, 1, 3}, 0.9},
		{"flat x", []float64{5, 5}, []float64{1, 9}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := slope(tt.xs, tt.ys); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("slope = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestVmRSS(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	_ = os.WriteFile(good, []byte("Name:\tx\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n"), 0o600)
	_ = os.WriteFile(bad, []byte("Name:\tx\n"), 0o600)
	if got, err := vmRSS(good); err != nil || got != 12345<<10 {
		t.Errorf("vmRSS = %v, %v; want %d", got, err, 12345<<10)
	}
	if _, err := vmRSS(bad); !errors.Is(err, errNoVmRSS) {
		t.Errorf("missing line: err = %v, want errNoVmRSS", err)
	}
}
