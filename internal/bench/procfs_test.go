package bench

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"status file", "Name:\tparley\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n", 12345 * 1024, false},
		{"missing", "Name:\tparley\n", 0, true},
		{"bad unit", "VmRSS:\t 5 MB\n", 0, true},
		{"bad number", "VmRSS:\t x kB\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVmRSS(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseVmRSS = %d, %v; want %d, err %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
	if _, err := parseVmRSS(strings.NewReader("")); !errors.Is(err, ErrNotFound) {
		t.Errorf("parseVmRSS(empty) err = %v, want ErrNotFound", err)
	}
}

func TestReadVmRSSSelf(t *testing.T) {
	got, err := ReadVmRSS(os.Getpid())
	if err != nil {
		t.Fatalf("ReadVmRSS(self): %v", err)
	}
	if got < 1<<20 {
		t.Errorf("ReadVmRSS(self) = %d bytes, implausibly small for a Go test binary", got)
	}
}

func TestParseMetrics(t *testing.T) {
	in := `# HELP parley_connections Client connections currently open on this node.
# TYPE parley_connections gauge
parley_connections 18000
parley_handshakes_total{result="ok"} 18003
parley_handshakes_total{result="rate_limited"} 2
weird_labels{a="x } y",b="{"} 1.5e+03 1700000000000
go_memstats_heap_inuse_bytes 4.2e+07
lag_seconds_bucket{node="a",le="0.5"} 3
lag_seconds_bucket{node="b",le="0.5"} 4
lag_seconds_bucket{le="+Inf",node="a"} 9

`
	m, err := parseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatalf("parseMetrics: %v", err)
	}
	for name, want := range map[string]float64{
		"parley_connections":           18000,
		"parley_handshakes_total":      18005,
		"weird_labels":                 1500,
		"go_memstats_heap_inuse_bytes": 4.2e7,
	} {
		if got, ok := m.Get(name); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	for le, want := range map[string]float64{"0.5": 7, "+Inf": 9} {
		if got, ok := m.Bucket("lag_seconds", le); !ok || got != want {
			t.Errorf("bucket %s = %v (present %v), want %v", le, got, ok, want)
		}
	}
	if got, _ := m.Get("lag_seconds_bucket"); got != 16 {
		t.Errorf("lag_seconds_bucket total = %v, want 16", got)
	}
	if _, ok := m.Get("absent"); ok {
		t.Error("absent metric reported present")
	}
	for _, bad := range []string{"x{a=\"1\" 3\n", "x\n", "x abc\n"} {
		if _, err := parseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("parseMetrics(%q) succeeded, want an error", bad)
		}
	}
}

func TestParsePerfCounts(t *testing.T) {
	events := []string{"syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync"}
	ok := "\n3,,syscalls:sys_enter_fsync,2000,100.00,,\n412,,syscalls:sys_enter_fdatasync,2000,100.00,,\n"
	got, err := parsePerfCounts(strings.NewReader(ok), events)
	if err != nil || got != 415 {
		t.Errorf("parsePerfCounts = %d, %v; want 415", got, err)
	}
	for name, in := range map[string]string{
		"not counted": "<not counted>,,syscalls:sys_enter_fsync,0,0,,\n1,,syscalls:sys_enter_fdatasync,1,100,,\n",
		"missing":     "1,,syscalls:sys_enter_fdatasync,1,100,,\n",
		"no output":   "",
	} {
		if _, err := parsePerfCounts(strings.NewReader(in), events); err == nil {
			t.Errorf("%s: parsePerfCounts succeeded, want an error", name)
		}
	}
}

func TestParseCPUTime(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Duration
		wantErr bool
	}{
		// utime 250 ticks, stime 125 ticks: 3.75 s.
		{"plain", "4242 (parley) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 125 0 0 20 0 12 0 100 0 0", 3750 * time.Millisecond, false},
		{"name with spaces and parens", "7 (a ) b) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0 0", 70 * time.Millisecond, false},
		{"no name", "7 a R 1", 0, true},
		{"short", "7 (x) R 1 2 3", 0, true},
		{"bad ticks", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 x 4 0", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCPUTime(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseCPUTime = %v, %v; want %v, err %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestReadCPUTimeSelf(t *testing.T) {
	before, err := ReadCPUTime(os.Getpid())
	if err != nil {
		t.Fatalf("ReadCPUTime(self): %v", err)
	}
	// Burn CPU until the counter moves (10 ms resolution; the bound is
	// generous for a shared machine).
	deadline := time.Now().Add(30 * time.Second)
	x := 0
	for time.Now().Before(deadline) {
		for i := range 1_000_000 {
			x += i
		}
		after, err := ReadCPUTime(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
	}
	t.Fatalf("CPU time did not move in 30 s of busy loop (%d)", x)
}
