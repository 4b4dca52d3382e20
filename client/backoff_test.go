package client

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	b := newBackoff(250*time.Millisecond, 30*time.Second)
	wantCeil := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for attempt, want := range wantCeil {
		if got := b.ceiling(attempt); got != want {
			t.Errorf("ceiling(%d) = %v, want %v", attempt, got, want)
		}
		var lo, hi time.Duration = want, 0
		for i := 0; i < 2000; i++ {
			d := b.delay(attempt)
			if d < 0 || d >= want {
				t.Fatalf("delay(%d) = %v, outside [0, %v)", attempt, d, want)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter spreads over the whole window, not around its top.
		if lo > want/10 || hi < want*9/10 {
			t.Errorf("delay(%d) spread [%v, %v] does not cover [0, %v)", attempt, lo, hi, want)
		}
	}
	if got := b.ceiling(1000); got != 30*time.Second {
		t.Errorf("ceiling(1000) = %v, want the cap (no overflow)", got)
	}
}

func TestBackoffAfter(t *testing.T) {
	b := newBackoff(100*time.Millisecond, time.Second)
	r := rand.New(rand.NewPCG(1, 2))
	b.rnd = r.Int64N
	for i := 0; i < 1000; i++ {
		d := b.after(4 * time.Second)
		if d < 4*time.Second || d >= 6*time.Second {
			t.Fatalf("after(4s) = %v, want in [4s, 6s)", d)
		}
		if d := b.after(10 * time.Millisecond); d < 10*time.Millisecond || d >= 110*time.Millisecond {
			t.Fatalf("after(10ms) = %v, want in [10ms, 110ms)", d)
		}
	}
}
