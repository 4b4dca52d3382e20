package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/protocol"
)

// ReactionsConfig configures the reaction storm benchmark: one group of
// Members members, Online of them connected (each one connection that
// counts the pushes it receives), and Reactors more members who react to
// one message, Rate reactions a second in all, for Duration — then, on
// the same group, plain messages at MessageRate for Duration, the
// fan-out reactions are compared with.
type ReactionsConfig struct {
	ServerBinary string
	DataDir      string // fresh directory for the server (empty: a temporary one)
	Members      int
	Online       int
	Reactors     int
	Rate         float64
	MessageRate  float64
	Duration     time.Duration
	Chunk        int // member ids per create_group / add_members frame
	Timeout      time.Duration
	Out, Stderr  io.Writer
	Logger       *slog.Logger
}

// DefaultReactionsConfig is the storm of `parley-bench reactions`: 1,000
// reactions a second on one message of a 10,000-member group.
func DefaultReactionsConfig() ReactionsConfig {
	return ReactionsConfig{
		Members: 10000, Online: 1000, Reactors: 100, Rate: 1000, MessageRate: 50, Duration: 10 * time.Second,
		Chunk: 2000, Timeout: 10 * time.Minute, Out: os.Stdout, Stderr: os.Stderr, Logger: slog.Default(),
	}
}

// Validate reports a configuration the benchmark cannot run with.
func (c ReactionsConfig) Validate() error {
	var errs []error
	if c.ServerBinary == "" {
		errs = append(errs, errors.New("server binary is required"))
	}
	if c.Online < 1 || c.Reactors < 1 || c.Online+c.Reactors+1 > c.Members {
		errs = append(errs, fmt.Errorf("need 1 ≤ online, 1 ≤ reactors and online + reactors + 1 ≤ members, got %d, %d, %d", c.Online, c.Reactors, c.Members))
	}
	if c.Rate <= 0 || c.MessageRate <= 0 || c.Duration <= 0 || c.Chunk < 1 || c.Timeout <= 0 {
		errs = append(errs, errors.New("rate, message rate, duration, chunk and timeout must be positive"))
	}
	if c.Out == nil || c.Stderr == nil || c.Logger == nil {
		errs = append(errs, errors.New("out, stderr and logger are required"))
	}
	return errors.Join(errs...)
}

// ReactionsPhase is what one phase (reactions, or plain messages)
// measured.
type ReactionsPhase struct {
	Name   string
	Sent   int
	Acked  int
	Errors int
	// Window is the sending window; Pushes the frames of the group the
	// online connections received from its start to the end of the
	// settling after it (pushes that lag the sends count too).
	Window time.Duration
	Pushes int64
	Online int
	// CPU is the server's CPU time over the window and the settling
	// after it (the last coalesced push).
	CPU time.Duration
	// Idle is the server's CPU time over as long a window with nothing
	// sent (heartbeats, timers).
	Idle time.Duration
}

// PushesPerMemberSecond is the pushes each online member received per
// second of the sending window.
func (p ReactionsPhase) PushesPerMemberSecond() float64 {
	return float64(p.Pushes) / float64(p.Online) / p.Window.Seconds()
}

// CPUPerOp is the server's CPU time per acknowledged reaction or message,
// and the same less the idle server's.
func (p ReactionsPhase) CPUPerOp() (all, busy time.Duration) {
	if p.Acked == 0 {
		return 0, 0
	}
	return p.CPU / time.Duration(p.Acked), max(p.CPU-p.Idle, 0) / time.Duration(p.Acked)
}

// RunReactions starts the server, builds the group, and runs the
// reactions phase and the messages phase; it prints a table.
func RunReactions(ctx context.Context, cfg ReactionsConfig) ([]ReactionsPhase, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench reactions: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	dir := cfg.DataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "parley-bench-reactions-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if _, err := auth.LoadOrCreateDevKey(dir); err != nil {
		return nil, err
	}
	srv, err := StartServer(ctx, ServerConfig{Binary: cfg.ServerBinary, DataDir: dir, Stderr: cfg.Stderr})
	if err != nil {
		return nil, err
	}
	defer func() { _ = srv.Stop() }()
	key, err := auth.LoadHS256KeyFile(filepath.Join(dir, auth.DevKeyFile))
	if err != nil {
		return nil, err
	}
	d := newDialer(srv.Addr, key, nil, 4096)
	owner, err := dialRPC(ctx, d, "owner", "d1")
	if err != nil {
		return nil, fmt.Errorf("bench reactions: %w", err)
	}
	defer owner.close()
	members := make([]string, 0, cfg.Members-1)
	for i := range cfg.Members - 1 {
		members = append(members, "m"+strconv.Itoa(i))
	}
	var setup FanoutResult
	start := time.Now()
	info, err := owner.createGroup(ctx, "storm", members, cfg.Chunk, -1, &setup)
	if err != nil {
		return nil, fmt.Errorf("bench reactions: %w", err)
	}
	fmt.Fprintf(cfg.Out, "group of %d members (tier %s) built in %v; %d online, %d reactors\n",
		info.MemberCount, info.Tier, time.Since(start).Round(time.Millisecond), cfg.Online, cfg.Reactors)

	// The online members: connections that count the group's pushes.
	var pushes atomic.Int64
	listeners := make([]*countingConn, cfg.Online)
	defer func() {
		for _, l := range listeners {
			if l != nil {
				l.close()
			}
		}
	}()
	if err := eachIndex(ctx, cfg.Online, 32, func(i int) error {
		ws, _, err := d.dial(ctx, members[i], "d1")
		if err != nil {
			return err
		}
		listeners[i] = startCounting(ws, &pushes)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("bench reactions: online members: %w", err)
	}
	reactors := make([]*rpcConn, cfg.Reactors)
	defer func() {
		for _, r := range reactors {
			if r != nil {
				r.close()
			}
		}
	}()
	if err := eachIndex(ctx, cfg.Reactors, 16, func(i int) error {
		c, err := dialRPC(ctx, d, members[cfg.Online+i], "d1")
		reactors[i] = c
		return err
	}); err != nil {
		return nil, fmt.Errorf("bench reactions: reactors: %w", err)
	}
	target, err := owner.call(ctx, &protocol.Frame{Type: protocol.TypeSend, ConvID: info.ConvID, ClientMsgID: "target", Body: "react to me"})
	if err != nil {
		return nil, fmt.Errorf("bench reactions: target: %w", err)
	}
	settle := 2 * time.Second
	if err := sleepCtx(ctx, settle); err != nil {
		return nil, err
	}

	phase := func(name string, rate float64, send func(i int) (<-chan *protocol.Frame, error)) (ReactionsPhase, error) {
		p := ReactionsPhase{Name: name, Online: cfg.Online}
		n := int(rate * cfg.Duration.Seconds())
		cpu0, err := ReadCPUTime(srv.PID())
		if err != nil {
			return p, err
		}
		pushes0 := pushes.Load()
		start := time.Now()
		answers := make([]<-chan *protocol.Frame, 0, n)
		for i := range n {
			if err := sleepCtx(ctx, time.Until(start.Add(time.Duration(float64(i)/rate*float64(time.Second))))); err != nil {
				return p, err
			}
			ch, err := send(i)
			if err != nil {
				return p, err
			}
			answers = append(answers, ch)
			p.Sent++
		}
		p.Window = time.Since(start)
		for _, ch := range answers {
			select {
			case f := <-ch:
				if f.Type == protocol.TypeError {
					p.Errors++
				} else {
					p.Acked++
				}
			case <-ctx.Done():
				return p, ctx.Err()
			}
		}
		if err := sleepCtx(ctx, settle); err != nil {
			return p, err
		}
		p.Pushes = pushes.Load() - pushes0
		cpu1, err := ReadCPUTime(srv.PID())
		if err != nil {
			return p, err
		}
		p.CPU = cpu1 - cpu0
		return p, nil
	}
	// The server's CPU with nothing sent, over as long a window: its
	// timers and the connections' heartbeats, taken off the phases'.
	idle, err := phase("idle", 1/cfg.Duration.Seconds(), func(int) (<-chan *protocol.Frame, error) {
		return owner.request(&protocol.Frame{Type: protocol.TypePing})
	})
	if err != nil {
		return nil, fmt.Errorf("bench reactions: %w", err)
	}
	// Each reactor toggles 👍 on the target: add, remove, add, ...
	on := make([]bool, cfg.Reactors)
	rp, err := phase("reactions", cfg.Rate, func(i int) (<-chan *protocol.Frame, error) {
		r := i % cfg.Reactors
		f := &protocol.Frame{Type: protocol.TypeReact, ConvID: info.ConvID, ClientMsgID: "r" + strconv.Itoa(i), TargetSeq: target.Seq, Emoji: "👍", Remove: on[r]}
		on[r] = !on[r]
		return reactors[r].request(f)
	})
	if err != nil {
		return nil, fmt.Errorf("bench reactions: %w", err)
	}
	body := string(bytes.Repeat([]byte("x"), 100))
	mp, err := phase("messages", cfg.MessageRate, func(i int) (<-chan *protocol.Frame, error) {
		return owner.request(&protocol.Frame{Type: protocol.TypeSend, ConvID: info.ConvID, ClientMsgID: "m" + strconv.Itoa(i), Body: body})
	})
	if err != nil {
		return nil, fmt.Errorf("bench reactions: %w", err)
	}
	rp.Idle, mp.Idle = idle.CPU, idle.CPU
	out := []ReactionsPhase{rp, mp}
	WriteReactionsTable(cfg.Out, out)
	return out, nil
}

// WriteReactionsTable prints the phases.
func WriteReactionsTable(w io.Writer, ps []ReactionsPhase) {
	fmt.Fprintln(w, "| phase | sent/s | acked | errors | pushes per online member per s | server CPU per op | less the idle server's |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	for _, p := range ps {
		all, busy := p.CPUPerOp()
		fmt.Fprintf(w, "| %s | %.0f | %d | %d | %.2f | %.1f µs | %.1f µs |\n", p.Name, float64(p.Sent)/p.Window.Seconds(), p.Acked, p.Errors,
			p.PushesPerMemberSecond(), us(all), us(busy))
	}
	if len(ps) > 0 {
		fmt.Fprintf(w, "\nidle server: %v CPU over a phase's window and settling\n", ps[0].Idle.Round(time.Millisecond))
	}
}

// countingConn reads a connection and counts the pushes of messages and
// reactions it receives, answering nothing (a large group asks no acks).
type countingConn struct {
	ws interface {
		ReadMessage() (int, []byte, error)
		Close() error
	}
	done chan struct{}
}

var (
	pushMsg       = []byte(`{"type":"msg"`)
	pushReactions = []byte(`{"type":"reactions"`)
)

func startCounting(ws interface {
	ReadMessage() (int, []byte, error)
	Close() error
}, n *atomic.Int64) *countingConn {
	c := &countingConn{ws: ws, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				return
			}
			if bytes.HasPrefix(data, pushMsg) || bytes.HasPrefix(data, pushReactions) {
				n.Add(1)
			}
		}
	}()
	return c
}

func (c *countingConn) close() {
	_ = c.ws.Close()
	<-c.done
}

// eachIndex runs f(0..n-1) on up to width goroutines and returns the first
// error.
func eachIndex(ctx context.Context, n, width int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, width)
	)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
