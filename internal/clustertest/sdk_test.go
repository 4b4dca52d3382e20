package clustertest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/protocol"
)

// watcher is one SDK client whose event stream is checked as it arrives:
// per conversation, after the first snapshot's starting point, every
// message must be the next seq — no hole, no repeat, no skip.
type watcher struct {
	user string
	cl   *client.Client
	done chan struct{}
	// log holds the client's debug diagnostics, shown when its stream
	// breaks.
	log *lockedBuffer

	mu struct {
		sync.Mutex
		known    map[uint64]bool
		last     map[uint64]uint64
		stream   map[uint64][]protocol.Message
		nodes    []string // node of each connection, in order
		problems []string
		runErr   error
		// allowSkips accepts the snapshot's documented jump (gap over
		// the snapshot range: the latest messages and a count of the
		// older ones) for tests whose outages outlast that range.
		allowSkips bool
		skipped    uint64
	}
}

// startWatcher runs an SDK client for user over every gateway of c
// (Config.URLs rotation). It is closed at the end of the test.
func startWatcher(t *testing.T, c *Cluster, user string) *watcher {
	t.Helper()
	log := &lockedBuffer{}
	cl, err := client.New(client.Config{
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		URLs:   c.URLs(), Token: c.Token(user), Device: "sdk",
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, RequestTimeout: 3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &watcher{user: user, cl: cl, done: make(chan struct{}), log: log}
	w.mu.known = make(map[uint64]bool)
	w.mu.last = make(map[uint64]uint64)
	w.mu.stream = make(map[uint64][]protocol.Message)
	go func() {
		err := cl.Run(context.Background())
		w.mu.Lock()
		w.mu.runErr = err
		w.mu.Unlock()
	}()
	go func() {
		defer close(w.done)
		for ev := range cl.Events() {
			w.observe(ev)
		}
	}()
	t.Cleanup(func() { cl.Close(); <-w.done })
	return w
}

func (w *watcher) problem(format string, args ...any) {
	if len(w.mu.problems) < 20 {
		w.mu.problems = append(w.mu.problems, fmt.Sprintf(format, args...))
	}
}

func (w *watcher) observe(ev client.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch ev.Kind {
	case client.EventConnected:
		w.mu.nodes = append(w.mu.nodes, ev.Hello.Node)
	case client.EventSnapshot:
		s := ev.Snapshot
		switch {
		case !w.mu.known[ev.ConvID]:
			w.mu.known[ev.ConvID] = true
			w.mu.last[ev.ConvID] = s.FromSeq
		case s.FromSeq > w.mu.last[ev.ConvID]:
			w.problem("conv %d: a snapshot restarted the stream at seq %d after seq %d: messages skipped", ev.ConvID, s.FromSeq, w.mu.last[ev.ConvID])
			w.mu.last[ev.ConvID] = s.FromSeq
		}
		if ev.Skipped > 0 && w.mu.allowSkips {
			w.mu.skipped += ev.Skipped
			w.mu.last[ev.ConvID] += ev.Skipped
		} else if ev.Skipped > 0 {
			w.problem("conv %d: a snapshot skipped %d messages after seq %d (gap over the snapshot range)", ev.ConvID, ev.Skipped, w.mu.last[ev.ConvID])
			w.mu.last[ev.ConvID] += ev.Skipped
		}
	case client.EventMessage:
		m := *ev.Message
		conv := ev.ConvID
		if !w.mu.known[conv] {
			// The SDK names every conversation's starting point with an
			// EventSnapshot before its first message (from the sync, or
			// from the conversation list for one first seen through a
			// push).
			w.problem("conv %d: message seq %d before the conversation's starting point (no snapshot event)", conv, m.Seq)
			w.mu.known[conv] = true
			w.mu.last[conv] = m.Seq - 1
		}
		if want := w.mu.last[conv] + 1; m.Seq != want {
			kind := "hole"
			if m.Seq < want {
				kind = "duplicate or out of order"
			}
			w.problem("conv %d: got seq %d, want %d (%s)", conv, m.Seq, want, kind)
		}
		w.mu.last[conv] = max(w.mu.last[conv], m.Seq)
		w.mu.stream[conv] = append(w.mu.stream[conv], m)
	}
}

// connections returns the node of each connection the client has had, in order.
func (w *watcher) connections() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.mu.nodes...)
}

// allowSkipping makes the watcher accept snapshots that skip messages.
func (w *watcher) allowSkipping() {
	w.mu.Lock()
	w.mu.allowSkips = true
	w.mu.Unlock()
}

func (w *watcher) lastSeq(conv uint64) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.last[conv]
}

// waitConnected waits until every watcher has connected at least once.
func waitConnected(t *testing.T, ws []*watcher, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, w := range ws {
		for len(w.connections()) == 0 {
			if time.Now().After(deadline) {
				w.mu.Lock()
				err := w.mu.runErr
				w.mu.Unlock()
				t.Fatalf("SDK client of %s did not connect within %v (Run: %v)", w.user, timeout, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitCaughtUp waits until each watcher has been handed every stored
// message of each of its conversations, and fails naming the laggards.
func waitCaughtUp(t *testing.T, ws []*watcher, cs convSet, hist map[uint64][]protocol.Message, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var behind []string
		for _, w := range ws {
			for conv, members := range cs.members {
				if !contains(members, w.user) {
					continue
				}
				want := uint64(len(hist[conv]))
				if got := w.lastSeq(conv); got < want {
					behind = append(behind, fmt.Sprintf("%s has conv %d up to seq %d of %d", w.user, conv, got, want))
				}
			}
		}
		if len(behind) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("SDK clients did not receive every stored message within %v (lost deliveries):\n%s", timeout, strings.Join(behind, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// verifyStreams compares each watcher's delivered stream with the stored
// history: the checks made on arrival (strictly increasing, dense after
// the snapshot point) must have passed, and each delivered message must be
// the stored one.
func verifyStreams(t *testing.T, ws []*watcher, hist map[uint64][]protocol.Message) {
	t.Helper()
	delivered, skipped := 0, uint64(0)
	for _, w := range ws {
		w.mu.Lock()
		problems := append([]string(nil), w.mu.problems...)
		runErr := w.mu.runErr
		skipped += w.mu.skipped
		streams := make(map[uint64][]protocol.Message, len(w.mu.stream))
		for k, v := range w.mu.stream {
			streams[k] = v
		}
		w.mu.Unlock()
		if runErr != nil {
			t.Errorf("SDK client of %s stopped: %v", w.user, runErr)
		}
		if len(problems) > 0 {
			t.Errorf("SDK client of %s: stream broken:\n%s\nits log:\n%s", w.user, strings.Join(problems, "\n"), w.log.tail(8192))
		}
		for _, conv := range sortedKeys(streams) {
			stored := hist[conv]
			for _, m := range streams[conv] {
				delivered++
				if m.Seq == 0 || m.Seq > uint64(len(stored)) {
					t.Errorf("%s: conv %d: delivered seq %d, but %d messages are stored", w.user, conv, m.Seq, len(stored))
					continue
				}
				s := stored[m.Seq-1]
				if s.MsgID != m.MsgID || s.ClientMsgID != m.ClientMsgID || s.Sender != m.Sender {
					t.Errorf("%s: conv %d seq %d: delivered msg %d %s/%q, stored msg %d %s/%q",
						w.user, conv, m.Seq, m.MsgID, m.Sender, m.ClientMsgID, s.MsgID, s.Sender, s.ClientMsgID)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d SDK clients: %d delivered messages match the stored history, no hole, no duplicate (%d skipped by snapshots over the range limit)", len(ws), delivered, skipped)
}

// lockedBuffer is an io.Writer safe for concurrent use that keeps what
// was written.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// tail returns at most the last n bytes written.
func (b *lockedBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.Bytes()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return string(s)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// sdkSenders makes each watcher send paced messages to its conversations
// with the SDK (which retries with the same client_msg_id) until stop
// closes; acknowledgements go to got.
func sdkSenders(ws []*watcher, cs convSet, got *acked, stop <-chan struct{}, pace time.Duration) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			convs := cs.convsOf[w.user]
			for i := 1; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(pace):
				}
				conv := convs[i%len(convs)]
				cmid := fmt.Sprintf("%s-sdk-%d", w.user, i)
				ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
				ack, err := w.cl.SendWithID(ctx, conv, cmid, "hello from "+cmid)
				cancel()
				if err != nil {
					got.fail("SDK send %s to conv %d: %v", cmid, conv, err)
					return
				}
				if ack.ClientMsgID != cmid || ack.ConvID != conv {
					got.fail("SDK send %s to conv %d: ack is for %q in conv %d", cmid, conv, ack.ClientMsgID, ack.ConvID)
				}
				got.record(conv, ack.Seq, cmid)
			}
		}()
	}
	return &wg
}

// sdkLoad is the shared shape of the delivery tests: users chat through
// SDK clients spread over the gateways while the test disturbs the
// cluster; at the end nothing acknowledged is lost or stored twice and
// every client's stream equals the stored history.
type sdkLoad struct {
	t        *testing.T
	c        *Cluster
	cs       convSet
	watchers []*watcher
	got      *acked
	stop     chan struct{}
	senders  *sync.WaitGroup
}

func startSDKLoad(t *testing.T, c *Cluster, users int, pace time.Duration) *sdkLoad {
	t.Helper()
	names := make([]string, users)
	for i := range names {
		names[i] = fmt.Sprintf("u%d", i)
	}
	l := &sdkLoad{t: t, c: c, got: newAcked(), stop: make(chan struct{})}
	l.cs = setupConvs(t, c, c.Gateways[0], names)
	for _, u := range names {
		l.watchers = append(l.watchers, startWatcher(t, c, u))
	}
	waitConnected(t, l.watchers, 20*time.Second)
	l.senders = sdkSenders(l.watchers, l.cs, l.got, l.stop, pace)
	return l
}

// finish stops the senders and runs every check.
func (l *sdkLoad) finish() {
	t := l.t
	t.Helper()
	start := time.Now()
	close(l.stop)
	l.senders.Wait()
	stopped := time.Now()
	hist := histories(t, l.c, l.cs)
	verifyStored(t, hist, l.got)
	read := time.Now()
	waitCaughtUp(t, l.watchers, l.cs, hist, 30*time.Second)
	t.Logf("senders stopped in %v, history read in %v, clients caught up %v later",
		stopped.Sub(start).Round(time.Millisecond), read.Sub(stopped).Round(time.Millisecond), time.Since(read).Round(time.Millisecond))
	verifyStreams(t, l.watchers, hist)
}

// nodeCounts counts the watchers' current nodes.
func nodeCounts(ws []*watcher) map[string]int {
	out := make(map[string]int)
	for _, w := range ws {
		if n := w.connections(); len(n) > 0 {
			out[n[len(n)-1]]++
		}
	}
	return out
}
