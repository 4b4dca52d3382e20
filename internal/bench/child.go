package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// child is a process started in its own process group, so that a Ctrl-C in
// the terminal reaches only the benchmark, which then stops its children in
// order (clients first, then the server with SIGTERM), and so that one kill
// reaches anything the child started.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once Wait has returned
	err  error         // Wait's result; read only after done is closed
}

// startChild starts cmd. deathSig is what the kernel sends the child if
// the benchmark dies without stopping it (kill -9), so nothing outlives it.
func startChild(name string, cmd *exec.Cmd, deathSig syscall.Signal) (*child, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop signals the child's process group with sig, waits up to grace for it
// to exit, then kills the group. It returns the child's exit error, if any
// other than the kill it was given. Calling it again is harmless.
func (c *child) stop(sig syscall.Signal, grace time.Duration) error {
	select {
	case <-c.done:
		return c.exitErr()
	default:
	}
	_ = syscall.Kill(-c.pid(), sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return c.exitErr()
	case <-t.C:
	}
	_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
	<-c.done
	return fmt.Errorf("stop %s: still running %v after %v; killed", c.name, sig, grace)
}

func (c *child) exitErr() error {
	if c.err != nil {
		return fmt.Errorf("%s: %w", c.name, c.err)
	}
	return nil
}

// Server is a `parley serve` child process.
type Server struct {
	Addr    string // host:port it listens on
	DataDir string
	c       *child
}

// ServerConfig says how to start a server child.
type ServerConfig struct {
	Binary  string   // the parley executable
	DataDir string   // fresh directory for its store and dev key
	Args    []string // extra `parley serve` flags
	Env     []string // added to the benchmark's environment
	Stderr  io.Writer
	// Ready bounds the wait for /readyz.
	Ready time.Duration
}

// StartServer starts `parley serve` on a free loopback port and waits until
// it answers /readyz. On error nothing is left running. The fair-sharing
// limits are lifted (Unthrottled) unless cfg.Args set them again.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.Ready == 0 {
		cfg.Ready = 30 * time.Second
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := append([]string{"serve", "--listen", addr, "--data-dir", cfg.DataDir}, cfg.Args...)
	cmd := exec.Command(cfg.Binary, args...)
	cmd.Stdout = cfg.Stderr
	cmd.Stderr = cfg.Stderr
	// The limits are lifted through the environment, not flags: a build
	// that predates a setting ignores an unknown PARLEY_* variable where it
	// would refuse an unknown flag, so -server-binary can start older builds.
	cmd.Env = append(append(os.Environ(), flagsAsEnv(Unthrottled)...), cfg.Env...)
	// SIGTERM on the benchmark's death lets the server close its store
	// cleanly instead of leaving a half-written WAL behind.
	c, err := startChild("server", cmd, syscall.SIGTERM)
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: addr, DataDir: cfg.DataDir, c: c}
	if err := waitReady(ctx, addr, c.done, cfg.Ready); err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("start server: %w", err)
	}
	return s, nil
}

// PID is the server's process id.
func (s *Server) PID() int { return s.c.pid() }

// Stop asks the server to drain and exit (SIGTERM) and kills it if it has
// not exited in time.
func (s *Server) Stop() error { return s.c.stop(syscall.SIGTERM, 30*time.Second) }

// MetricsURL is the server's Prometheus endpoint.
func (s *Server) MetricsURL() string { return "http://" + s.Addr + "/metrics" }

// freePort asks the kernel for an unused port. Another process could take it
// before the server binds it; on a benchmark machine that is rare enough, and
// the server then fails loudly rather than measuring the wrong thing.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var errExited = errors.New("server exited before it was ready")

func waitReady(ctx context.Context, addr string, exited <-chan struct{}, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s/readyz: %w", addr, ctx.Err())
		case <-tick.C:
		}
	}
}

// serveCommands reads one command per line from in until in ends or ctx is
// done, writing each command's answer line to out: the reply of handle, or
// "err MESSAGE". The benchmark drives its client processes this way;
// closing their stdin is the normal way to stop them.
func serveCommands(ctx context.Context, in io.Reader, out io.Writer, handle func(line string) (string, error)) {
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case line, ok := <-lines:
			if !ok {
				return
			}
			reply, err := handle(line)
			if err != nil {
				fmt.Fprintf(out, "%s %v\n", respErr, err)
				continue
			}
			fmt.Fprintln(out, reply)
		}
	}
}

// reportCommand answers the "report" command with report() as JSON.
func reportCommand(report func() any) func(string) (string, error) {
	return func(line string) (string, error) {
		if line != cmdReport {
			return "", fmt.Errorf("bad command %q", line)
		}
		b, err := json.Marshal(report())
		if err != nil {
			return "", err
		}
		return respReport + " " + string(b), nil
	}
}

// flagsAsEnv turns "--a.b-c", "v" pairs into PARLEY_A_B_C=v, the
// variables `parley serve` reads for the same settings.
func flagsAsEnv(flags []string) []string {
	var out []string
	for i := 0; i+1 < len(flags); i += 2 {
		name := strings.TrimLeft(flags[i], "-")
		name = strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(name))
		out = append(out, "PARLEY_"+name+"="+flags[i+1])
	}
	return out
}

// Unthrottled lifts the per-user and per-connection fair-sharing limits:
// the benchmarks drive one user far beyond what a person sends, to measure
// the node, not its limiter.
var Unthrottled = []string{
	"--gateway.user-send-rate", "1e9", "--gateway.user-send-burst", "1000000000",
	"--gateway.conn-request-rate", "1e9", "--gateway.conn-request-burst", "1000000000",
	"--gateway.max-sessions-per-user", "1000000", "--gateway.max-poll-sessions-per-user", "1000000",
	"--gateway.user-handshake-rate", "1e9", "--gateway.user-handshake-burst", "1000000000",
	"--gateway.source-accept-rate", "0",
}
