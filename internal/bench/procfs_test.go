package bench

import (
	"errors"
	"os"
	"strings"
	"testing"
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
