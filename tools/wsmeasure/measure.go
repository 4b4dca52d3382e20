//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var errNoVmRSS = errors.New("no VmRSS line")

// child is a server or client process; clients take "add K" on stdin.
type child struct {
	cmd   *exec.Cmd
	stdin io.Writer
}

func runMeasure(args []string) error {
	fs := flag.NewFlagSet("measure", flag.ContinueOnError)
	impl := fs.String("impl", "nbio", "nbio, gorilla or coder")
	conns := fs.Int("conns", 15000, "connections at the last checkpoint (server fd limit: stay <= 18000)")
	procs := fs.Int("procs", 3, "client processes, each on its own 127.0.0.x source address")
	step := fs.Int("step", 3000, "connections between checkpoints")
	port := fs.Int("port", 18080, "server port; the debug endpoint uses port+1")
	quiet := fs.Duration("quiet", 3*time.Second, "quiet period before each reading")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *conns < 1 || *conns > 18000 || *procs < 1 || *conns/(*procs) > maxClientConns || *step <= 0 {
		return fmt.Errorf("measure: -conns %d -procs %d -step %d is outside the fd limits", *conns, *procs, *step)
	}
	var kids []*child
	defer func() { // Pdeathsig also kills them if measure itself is killed
		for _, c := range kids {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	}()
	addr, debugAddr := fmt.Sprintf("127.0.0.1:%d", *port), fmt.Sprintf("127.0.0.1:%d", *port+1)
	debugURL := "http://" + debugAddr + "/"
	srvArgs := append([]string{"server", "-impl", *impl, "-addr", addr, "-debug", debugAddr}, fs.Args()...)
	for i := -1; i < *procs; i++ {
		args := srvArgs
		if i >= 0 {
			args = []string{"clients", "-url", "ws://" + addr + "/ws", "-src", fmt.Sprintf("127.0.0.%d", 2+i)}
		}
		c, err := start("/proc/self/exe", args) // this binary, re-run in another mode
		if err != nil {
			return err
		}
		kids = append(kids, c)
		if err := waitConns(debugURL, 0); err != nil {
			return err
		}
	}
	fmt.Printf("impl=%s: %s\n%8s %10s %10s %10s %10s %10s\n", *impl, strings.Join(srvArgs, " "),
		"conns", "rss_KB", "rssNat_KB", "heap_KB", "stack_KB", "goroutines")
	// cols holds, per checkpoint: rss, rssNat, heap, stack (bytes), goroutines.
	var xs []float64
	var cols [5][]float64
	for target, have := 0, 0; have < *conns || target == 0; target = min(target+*step, *conns) {
		if err := grow(kids[1:], target-have); err != nil {
			return err
		}
		have = target
		row, err := takeSample(kids[0].cmd.Process.Pid, debugURL, target, *quiet)
		if err != nil {
			return err
		}
		xs = append(xs, float64(target))
		for i, v := range row {
			cols[i] = append(cols[i], v)
		}
		fmt.Printf("%8d %10.0f %10.0f %10.0f %10.0f %10.0f\n", target, row[0]/1024, row[1]/1024, row[2]/1024, row[3]/1024, row[4])
	}
	fmt.Printf("RESULT impl=%s conns=%d rss=%.0f rssNat=%.0f heap=%.0f stack=%.0f B/conn goroutines=%.3f/conn\n", *impl, *conns,
		slope(xs, cols[0]), slope(xs, cols[1]), slope(xs, cols[2]), slope(xs, cols[3]), slope(xs, cols[4]))
	return nil
}

// start launches a child that gets SIGKILL when this process dies.
func start(exe string, args []string) (*child, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		return nil, fmt.Errorf("measure: start %s: %w", args[0], err)
	}
	return &child{cmd: cmd, stdin: stdin}, nil
}

// grow spreads delta new connections over the clients; takeSample then waits
// until the server holds them all, which is the count that matters.
func grow(clients []*child, delta int) error {
	for i, c := range clients {
		k := delta / len(clients)
		if i < delta%len(clients) {
			k++
		}
		if _, err := fmt.Fprintf(c.stdin, "add %d\n", k); err != nil {
			return fmt.Errorf("measure: client %d: %w", i, err)
		}
	}
	return nil
}

// takeSample returns rss, rssNat, heap, stack and goroutines once the server
// holds conns sessions. rssNat is VmRSS after a quiet period alone, rss after
// the server has also run debug.FreeOSMemory.
func takeSample(pid int, debugURL string, conns int, quiet time.Duration) (row [5]float64, err error) {
	status := fmt.Sprintf("/proc/%d/status", pid)
	if err = waitConns(debugURL, conns); err == nil {
		time.Sleep(quiet)
		row[1], err = vmRSS(status)
	}
	var rep memReport
	if err == nil {
		rep, err = fetchReport(debugURL + "?free=1")
		time.Sleep(time.Second)
	}
	if err == nil {
		row[0], err = vmRSS(status)
	}
	row[2], row[3], row[4] = float64(rep.HeapInuse), float64(rep.StackInuse), float64(rep.Goroutines)
	return row, err
}

// waitConns polls the debug endpoint until the server holds want sessions.
func waitConns(debugURL string, want int) error {
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		rep, err := fetchReport(debugURL)
		if err == nil && rep.Conns == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("measure: server holds %d sessions, want %d (err %v)", rep.Conns, want, err)
		}
	}
}

func fetchReport(url string) (rep memReport, err error) {
	resp, err := http.Get(url)
	if err == nil {
		defer resp.Body.Close()
		err = json.NewDecoder(resp.Body).Decode(&rep)
	}
	if err != nil {
		return rep, fmt.Errorf("measure: debug endpoint: %w", err)
	}
	return rep, nil
}

// vmRSS reads VmRSS in bytes from a /proc/PID/status file.
func vmRSS(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("measure: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return float64(kb << 10), err
		}
	}
	return 0, fmt.Errorf("measure: %s: %w", path, errNoVmRSS)
}

// slope is the least-squares slope of ys against xs; 0 when xs do not vary.
func slope(xs, ys []float64) float64 {
	var sx, sy, sxy, sxx float64
	for i := range xs {
		sx, sy, sxy, sxx = sx+xs[i], sy+ys[i], sxy+xs[i]*ys[i], sxx+xs[i]*xs[i]
	}
	n := float64(len(xs))
	if den := n*sxx - sx*sx; den != 0 {
		return (n*sxy - sx*sy) / den
	}
	return 0
}
