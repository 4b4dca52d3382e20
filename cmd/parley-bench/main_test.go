package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/testbin"
)

// parley and parleyBench are built side by side, as a user builds them.
var parley, parleyBench string

func TestMain(m *testing.M) {
	testbin.Main(m, &parley, testbin.Command{Name: "parley-bench", Path: &parleyBench})
}

// runBin runs bin with args and returns its combined output and error.
func runBin(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

// TestIdleReexecsItself: the idle benchmark starts the parley beside it as
// the server and its own executable as the idle-client processes, and the
// server counts every connection they hold.
func TestIdleReexecsItself(t *testing.T) {
	out, err := runBin(t, parleyBench, "idle", "-conns", "40", "-procs", "2", "-step", "20", "-settle", "50ms")
	if err != nil {
		t.Fatalf("idle: %v\n%s", err, out)
	}
	if !strings.Contains(out, "| 40 | 40 |") || !strings.Contains(out, "RSS slope") {
		t.Fatalf("idle: no 40-connection checkpoint counted by the server:\n%s", out)
	}
}

// TestFanoutReexecsItself: the delivery scenario's members are online in a
// fanout-client process of the bench's own executable, and every push
// reaches them exactly once.
func TestFanoutReexecsItself(t *testing.T) {
	out, err := runBin(t, parleyBench, "fanout", "-only", "delivery-30", "-delivery-members", "30", "-procs", "1",
		"-messages", "3", "-rate", "20", "-delivery-wait", "5s")
	if err != nil {
		t.Fatalf("fanout: %v\n%s", err, out)
	}
	if !strings.Contains(out, "| delivery-30 | 30 | 3 | 90 (90) | 0 / 0 / 0 |") {
		t.Fatalf("fanout: not 90 of 90 deliveries without loss or duplicates:\n%s", out)
	}
}

// TestServerBinary: without a parley beside it the bench says how to get
// one, and -server-binary names one anywhere.
func TestServerBinary(t *testing.T) {
	alone := filepath.Join(t.TempDir(), "parley-bench")
	b, err := os.ReadFile(parleyBench)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := runBin(t, alone, "send", "-pairs", "1", "-messages", "3")
	if err == nil || !strings.Contains(out, "no parley executable beside") || !strings.Contains(out, "-server-binary") {
		t.Fatalf("send without a server binary: err %v\n%s", err, out)
	}
	out, err = runBin(t, alone, "send", "-pairs", "1", "-messages", "3", "-server-binary", parley)
	if err != nil {
		t.Fatalf("send -server-binary: %v\n%s", err, out)
	}
	if !strings.Contains(out, "| messages sent / ACKed / delivered | 3 / 3 / 3 |") {
		t.Fatalf("send -server-binary: not 3 messages sent, ACKed and delivered:\n%s", out)
	}
}

// TestUsage: no benchmark is an error, -h is not, and the hidden client
// subcommands stay out of the usage.
func TestUsage(t *testing.T) {
	out, err := runBin(t, parleyBench)
	if err == nil || !strings.Contains(out, "usage: parley-bench <idle|send|fanout|reactions|history|attach>") {
		t.Fatalf("no arguments: err %v\n%s", err, out)
	}
	out, err = runBin(t, parleyBench, "-h")
	if err != nil {
		t.Fatalf("-h: %v\n%s", err, out)
	}
	for _, hidden := range []string{idleClientCmd, fanoutClientCmd, stormClientCmd} {
		if strings.Contains(out, hidden) {
			t.Errorf("-h lists %s:\n%s", hidden, out)
		}
	}
}

// TestAttach runs a small attachment benchmark on the disk engine: every
// row of the raw engine and of the seam is printed.
func TestAttach(t *testing.T) {
	out, err := runBin(t, parleyBench, "attach", "-engines", "disk", "-dir", t.TempDir(),
		"-big-bytes", "2097152", "-small-bytes", "4096", "-concurrency", "4", "-rss-uploads", "2")
	if err != nil {
		t.Fatalf("attach: %v\n%s", err, out)
	}
	for _, row := range []string{"dd          up 1×2 MiB", "dd          down 4×4096 B", "seam Put    up 1×2 MiB", "seam parts  up 1×2 MiB", "seam Put    down 4×4096 B", "seam RSS during 2 concurrent"} {
		if !strings.Contains(out, row) {
			t.Errorf("no row %q in:\n%s", row, out)
		}
	}
}
