package clustertest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// engineProc is a private Redis or NATS server that a test kills and starts
// again on the same port (the shared engines must not be disturbed).
type engineProc struct {
	t     *testing.T
	name  string
	addr  string   // host:port
	argv  []string // binary and flags
	ready func(addr string) bool
	logf  string
	mu    sync.Mutex
	cmd   *exec.Cmd
}

// startPrivateRedis runs a memory-only redis-server: a restart loses every
// key, as a real Redis without persistence would.
func startPrivateRedis(t *testing.T) *engineProc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires redis-server on PATH for the Redis restart test")
		}
		t.Skip("redis-server not on PATH")
	}
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	e := &engineProc{
		t: t, name: "redis", addr: addr, logf: filepath.Join(dir, "redis.log"),
		argv: []string{bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log")},
		ready: redisReady,
	}
	e.start()
	t.Cleanup(e.cleanup)
	return e
}

func redisReady(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

var (
	natsOnce sync.Once
	natsBin  string
	natsErr  error
)

// startPrivateNATS runs a NATS server with JetStream whose store directory
// survives restarts (the compensation stream lives there).
func startPrivateNATS(t *testing.T) *engineProc {
	t.Helper()
	natsOnce.Do(func() {
		natsBin = filepath.Join(filepath.Dir(binary), "natsserver")
		out, err := exec.Command("go", "build", "-o", natsBin, "github.com/parley-im/parley/scripts/engines/natsserver").CombinedOutput()
		if err != nil {
			natsErr = fmt.Errorf("build natsserver: %v\n%s", err, out)
		}
	})
	if natsErr != nil {
		t.Fatal(natsErr)
	}
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	e := &engineProc{
		t: t, name: "nats", addr: addr, logf: filepath.Join(dir, "nats.log"),
		argv:  []string{natsBin, "-js", "-a", "127.0.0.1", "-p", port, "-sd", filepath.Join(dir, "store"), "-l", filepath.Join(dir, "nats.log")},
		ready: natsReady,
	}
	e.start()
	t.Cleanup(e.cleanup)
	return e
}

// natsReady reads the INFO line a NATS server greets clients with;
// JetStream is usable once it says so.
func natsReady(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.Contains(line, `"jetstream":true`)
}

// URL is the NATS URL of a private NATS server.
func (e *engineProc) URL() string { return "nats://" + e.addr }

func (e *engineProc) start() {
	e.t.Helper()
	cmd := exec.Command(e.argv[0], e.argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start %s: %v", e.name, err)
	}
	e.mu.Lock()
	e.cmd = cmd
	e.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if e.ready(e.addr) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(e.logf)
	e.t.Fatalf("private %s not ready on %s within 20s; log:\n%s", e.name, e.addr, tail(string(log), 2000))
}

func (e *engineProc) cleanup() {
	e.kill()
	if e.t.Failed() {
		log, _ := os.ReadFile(e.logf)
		e.t.Logf("--- log of the private %s ---\n%s", e.name, tail(string(log), 3000))
	}
}

// kill stops the server with SIGKILL (idempotent).
func (e *engineProc) kill() {
	e.mu.Lock()
	cmd := e.cmd
	e.cmd = nil
	e.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// restart kills the server and starts it again on the same port after down.
func (e *engineProc) restart(down time.Duration) {
	e.t.Helper()
	e.kill()
	time.Sleep(down)
	e.start()
}
