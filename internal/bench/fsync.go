package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// fsyncEvents are the syscalls that make a write durable; Pebble's WAL uses
// fdatasync on Linux, other files fsync.
var fsyncEvents = []string{"syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync"}

// fsyncCounter counts a process's fsync-family syscalls with perf(1). The
// store keeps no count of its own, and the count is what shows group commit
// at work: fewer syncs than messages.
type fsyncCounter struct {
	c   *child
	out bytes.Buffer
}

func startFsyncCounter(pid int) (*fsyncCounter, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("count fsyncs: no server pid")
	}
	// Counters opened on the process's threads are inherited by threads
	// created later, so Go starting new Ms does not hide syscalls.
	f := &fsyncCounter{}
	cmd := exec.Command("perf", "stat", "-x,", "-e", strings.Join(fsyncEvents, ","), "-p", strconv.Itoa(pid))
	cmd.Stderr = &f.out
	c, err := startChild("perf", cmd, syscall.SIGINT)
	if err != nil {
		return nil, fmt.Errorf("count fsyncs: %w", err)
	}
	f.c = c
	// perf needs a moment to open its counters; syscalls before that would
	// be missed.
	time.Sleep(300 * time.Millisecond)
	select {
	case <-c.done:
		return nil, fmt.Errorf("count fsyncs: perf exited: %s", strings.TrimSpace(f.out.String()))
	default:
	}
	return f, nil
}

// stop ends perf (SIGINT makes it print its counts) and returns the total.
// Calling it again returns the same total.
func (f *fsyncCounter) stop() (int64, error) {
	// perf exits 130-ish after SIGINT on some versions; its output is what
	// matters.
	_ = f.c.stop(syscall.SIGINT, 5*time.Second)
	n, err := parsePerfCounts(bytes.NewReader(f.out.Bytes()), fsyncEvents)
	if err != nil {
		return 0, fmt.Errorf("count fsyncs: %w", err)
	}
	return n, nil
}

// parsePerfCounts sums the counts of events in perf stat's CSV output
// (-x,): "COUNT,UNIT,EVENT,...". An event perf could not count ("<not
// counted>", "<not supported>") is an error, not a zero.
func parsePerfCounts(r io.Reader, events []string) (int64, error) {
	want := map[string]bool{}
	for _, e := range events {
		want[e] = true
	}
	var total int64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ",")
		if len(fields) < 3 || !want[fields[2]] {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("perf: %s: %q", fields[2], fields[0])
		}
		total += n
		delete(want, fields[2])
	}
	if len(want) > 0 {
		return 0, fmt.Errorf("perf: no count for %d of %d events", len(want), len(events))
	}
	return total, nil
}
