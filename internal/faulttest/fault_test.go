// Package faulttest is the randomized fault test of the delivery path: many
// users and devices in direct conversations and groups of every fan-out
// tier send, edit, recall, join, leave and read while faults are injected —
// store errors on row writes and member reads, registry and bus failures,
// disconnects, restarts and kill -9 of the server, also right after an ACK
// — and a checker then proves every acknowledged message is visible exactly
// once at its seq to every member device through sync, history and the HTTP
// snapshot (and was pushed to devices online), nothing outside a member's
// [join_seq, leave_seq], and unread counts and mention flags right. Runs
// are seeded; the seed is printed and set with PARLEY_FAULT_SEED or
// -fault.seed.
package faulttest

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/testbin"
)

var binary string

func TestMain(m *testing.M) { testbin.Main(m, &binary) }

// TestRandomFaults runs the embedded server in process with injected
// store, registry and bus faults and restarts that abandon the fan-out
// queue (the outbox in the store carries it over).
func TestRandomFaults(t *testing.T) {
	sd := seed(t)
	ops := 400
	if testing.Short() {
		ops = 150
	}
	run(t, newInproc(t, sd), sd, ops, 3)
}

// TestRandomKill9 runs the real binary and kills it with SIGKILL at random
// points, some right after an ACK.
func TestRandomKill9(t *testing.T) {
	sd := seed(t)
	ops := 300
	if testing.Short() {
		ops = 120
	}
	n := &binTarget{t: t, dir: t.TempDir(), addr: freeAddr(t)}
	key := make([]byte, 32)
	_, _ = crand.Read(key)
	n.key = key
	n.start()
	t.Cleanup(n.stop)
	run(t, n, sd, ops, 5)
}

// faults is the switchable fault injector shared by the wrappers: while on,
// each covered call fails with probability 1/3.
type faults struct {
	on  atomicBool
	mu  sync.Mutex
	rng *rand.Rand
}

type atomicBool struct {
	mu sync.Mutex
	v  bool
}

func (b *atomicBool) set(v bool) { b.mu.Lock(); b.v = v; b.mu.Unlock() }
func (b *atomicBool) get() bool  { b.mu.Lock(); defer b.mu.Unlock(); return b.v }

var errInjected = errors.New("injected fault")

func (f *faults) fail() error {
	if !f.on.get() {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng.IntN(3) == 0 {
		return errInjected
	}
	return nil
}

// flakyStore fails row writes, member reads and outbox calls.
type flakyStore struct {
	store.Store
	f *faults
}

func (s flakyStore) UpdateRows(ctx context.Context, conv, seq uint64, users []string, mention bool) error {
	if err := s.f.fail(); err != nil {
		return err
	}
	return s.Store.UpdateRows(ctx, conv, seq, users, mention)
}

func (s flakyStore) Members(ctx context.Context, conv uint64) ([]store.Member, error) {
	if err := s.f.fail(); err != nil {
		return nil, err
	}
	return s.Store.Members(ctx, conv)
}

func (s flakyStore) FanoutDone(ctx context.Context, conv uint64, seqs []uint64) error {
	if err := s.f.fail(); err != nil {
		return err
	}
	return s.Store.FanoutDone(ctx, conv, seqs)
}

func (s flakyStore) Pending(ctx context.Context, limit int) ([]store.Pending, error) {
	if err := s.f.fail(); err != nil {
		return nil, err
	}
	return s.Store.Pending(ctx, limit)
}

type flakyRegistry struct {
	registry.Registry
	f *faults
}

func (r flakyRegistry) Lookup(ctx context.Context, users []string) (map[string][]registry.Entry, error) {
	if err := r.f.fail(); err != nil {
		return nil, err
	}
	return r.Registry.Lookup(ctx, users)
}

type flakyBus struct {
	bus.Bus
	f *faults
}

func (b flakyBus) Publish(ctx context.Context, node string, d bus.Delivery) error {
	if err := b.f.fail(); err != nil {
		return err
	}
	return b.Bus.Publish(ctx, node, d)
}

// inproc is the embedded server in this process.
type inproc struct {
	t   *testing.T
	dir string
	key []byte
	f   *faults
	srv *servertest.Server
	// cluster, if set, runs the node on the cluster engines.
	cluster *config.Cluster
}

func newInproc(t *testing.T, sd uint64) *inproc {
	n := &inproc{t: t, dir: t.TempDir(), f: &faults{rng: rand.New(rand.NewPCG(sd, 7))}}
	n.key = make([]byte, 32)
	_, _ = crand.Read(n.key)
	n.restart()
	return n
}

func (n *inproc) url() string { return n.srv.Addr() }

func (n *inproc) token(user string) string { return servertest.MintToken(n.t, n.key, user, time.Hour) }

func (n *inproc) faults(on bool) { n.f.on.set(on) }

func (n *inproc) crash() { n.srv.Close() }

func (n *inproc) restart() { n.srv = servertest.Start(n.t, n.options()...) }

// binTarget is the real binary, killed with SIGKILL.
type binTarget struct {
	t    *testing.T
	dir  string
	addr string
	key  []byte
	cmd  *exec.Cmd
}

func (n *binTarget) url() string { return n.addr }

func (n *binTarget) token(user string) string {
	tok, err := auth.MintHS256(n.key, auth.Claims{User: user, IssuedAt: time.Now().Add(-time.Minute), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		n.t.Fatal(err)
	}
	return tok
}

func (n *binTarget) faults(bool) {}

func (n *binTarget) start() {
	n.cmd = exec.Command(binary, "serve", "--listen", n.addr, "--data-dir", n.dir,
		"--auth.hs256-key", hex.EncodeToString(n.key), "--log.level", "error",
		"--chat.small-below", "5", "--chat.large-above", "8", "--chat.everyone-interval", "0s")
	n.cmd.Stderr = os.Stderr
	if err := n.cmd.Start(); err != nil {
		n.t.Fatalf("start parley: %v", err)
	}
	if !testbin.Ready(n.addr, 30*time.Second) {
		n.t.Fatal("parley did not become ready within 30s")
	}
}

func (n *binTarget) crash() {
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Wait()
}

func (n *binTarget) restart() { n.start() }

func (n *binTarget) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		n.crash()
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
