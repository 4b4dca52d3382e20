package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

// rawConn is a synchronous request/response connection speaking raw frames;
// pushes that arrive while it waits for an answer are ignored. It may be
// used from any goroutine (it never calls t.Fatal).
type rawConn struct {
	ws    *websocket.Conn
	hello protocol.Hello
	rid   int
}

// dialRaw connects user's device to gateway g and waits for the hello.
func dialRaw(c *Cluster, g *Proc, user, device string) (*rawConn, error) {
	h := http.Header{"Authorization": {"Bearer " + c.Token(user)}}
	d := websocket.Dialer{HandshakeTimeout: 2 * time.Second}
	ws, resp, err := d.Dial(g.URL()+"/v1/ws?device="+device, h)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s as %s/%s: %w", g.Name, user, device, err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(3 * time.Second))
	var f protocol.Frame
	if err := ws.ReadJSON(&f); err != nil || f.Type != protocol.TypeHello || f.Hello == nil {
		ws.Close()
		return nil, fmt.Errorf("dial %s as %s/%s: no hello (%v, got %q)", g.Name, user, device, err, f.Type)
	}
	return &rawConn{ws: ws, hello: *f.Hello}, nil
}

// call sends f and returns the answer carrying its rid, waiting at most
// timeout (an error means the outcome is unknown).
func (r *rawConn) call(f protocol.Frame, timeout time.Duration) (*protocol.Frame, error) {
	r.rid++
	f.RID = fmt.Sprint(r.rid)
	_ = r.ws.SetWriteDeadline(time.Now().Add(timeout))
	if err := r.ws.WriteJSON(f); err != nil {
		return nil, err
	}
	_ = r.ws.SetReadDeadline(time.Now().Add(timeout))
	for {
		_, data, err := r.ws.ReadMessage()
		if err != nil {
			return nil, err
		}
		var a protocol.Frame
		if err := json.Unmarshal(data, &a); err != nil {
			return nil, err
		}
		if a.RID == f.RID {
			return &a, nil
		}
	}
}

func (r *rawConn) close() { r.ws.Close() }

// acked is what the servers acknowledged: conv → seq → client_msg_id.
type acked struct {
	mu      sync.Mutex
	seqs    map[uint64]map[uint64]string
	times   map[uint64][]time.Time // conv → when each ack arrived
	errs    []string
	retries int // raw sends repeated after an error, a timeout or a lost connection
}

func newAcked() *acked {
	return &acked{seqs: make(map[uint64]map[uint64]string), times: make(map[uint64][]time.Time)}
}

// firstAfter returns the time of conv's first ack after t (zero if none).
func (a *acked) firstAfter(conv uint64, t time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, at := range a.times[conv] {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
}

func (a *acked) record(conv, seq uint64, cmid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.seqs[conv]
	if m == nil {
		m = make(map[uint64]string)
		a.seqs[conv] = m
	}
	if prev, ok := m[seq]; ok && prev != cmid {
		a.errs = append(a.errs, fmt.Sprintf("conv %d seq %d acknowledged for %q and for %q: seq reused", conv, seq, prev, cmid))
	}
	m[seq] = cmid
	a.times[conv] = append(a.times[conv], time.Now())
}

func (a *acked) fail(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.errs) < 20 {
		a.errs = append(a.errs, fmt.Sprintf(format, args...))
	}
}

func (a *acked) retried() {
	a.mu.Lock()
	a.retries++
	a.mu.Unlock()
}

// afterFault returns the first acknowledgement after the fault at from
// and the longest time without one between from and to.
func (a *acked) afterFault(from, to time.Time) (first time.Time, gap time.Duration) {
	a.mu.Lock()
	var all []time.Time
	for _, ts := range a.times {
		all = append(all, ts...)
	}
	a.mu.Unlock()
	slices.SortFunc(all, time.Time.Compare)
	prev := from
	for _, at := range all {
		if !at.After(from) {
			continue
		}
		if first.IsZero() {
			first = at
		}
		if at.After(to) {
			at = to
		}
		gap = max(gap, at.Sub(prev))
		if at.Equal(to) {
			break
		}
		prev = at
	}
	return first, gap
}

// maxSeq is the highest seq acknowledged in conv so far.
func (a *acked) maxSeq(conv uint64) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var top uint64
	for seq := range a.seqs[conv] {
		top = max(top, seq)
	}
	return top
}

func (a *acked) total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, m := range a.seqs {
		n += len(m)
	}
	return n
}

// convSet is the conversations of a load test: one group of every user and
// a direct conversation per pair of users.
type convSet struct {
	group   uint64
	convsOf map[string][]uint64 // the conversations a user sends to
	members map[uint64][]string
}

// setupConvs creates the group (by users[0]) and the direct
// conversations of (users[0], users[1]), (users[2], users[3]), … through
// gateway g.
func setupConvs(t *testing.T, c *Cluster, g *Proc, users []string) convSet {
	t.Helper()
	if len(users)%2 != 0 {
		t.Fatalf("setupConvs needs an even number of users, got %d", len(users))
	}
	cs := convSet{convsOf: make(map[string][]uint64), members: make(map[uint64][]string)}
	for i := 0; i < len(users); i += 2 {
		rc, err := dialRaw(c, g, users[i], "setup")
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			r, err := rc.call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "load", Members: users[1:]}, 20*time.Second)
			if err != nil || r.Type != protocol.TypeConv {
				t.Fatalf("create group: %v %s", err, frameString(r))
			}
			cs.group = r.Conv.ConvID
			cs.members[cs.group] = users
		}
		r, err := rc.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: users[i+1]}, 20*time.Second)
		if err != nil || r.Type != protocol.TypeConv {
			t.Fatalf("open direct %s-%s: %v %s", users[i], users[i+1], err, frameString(r))
		}
		rc.close()
		d := r.Conv.ConvID
		cs.members[d] = []string{users[i], users[i+1]}
		cs.convsOf[users[i]] = []uint64{cs.group, d}
		cs.convsOf[users[i+1]] = []uint64{cs.group, d}
	}
	return cs
}

func frameString(f *protocol.Frame) string {
	if f == nil {
		return "<no frame>"
	}
	b, _ := json.Marshal(f)
	return string(b)
}

// rawSender sends text messages until stop closes, retrying an
// unacknowledged message with the same client_msg_id across errors,
// timeouts, reconnects and process deaths; each attempt after a failure
// goes to the next gateway in turn. Sends are paced by pace.
func rawSender(ctx context.Context, c *Cluster, user string, convs []uint64, got *acked, stop <-chan struct{}, pace time.Duration) {
	var (
		rc      *rawConn
		pending *protocol.Frame
		i, gi   int
	)
	gi = int(hashString(user))
	defer func() {
		if rc != nil {
			rc.close()
		}
	}()
	for {
		if pending == nil {
			select {
			case <-stop:
				return
			case <-time.After(pace):
			}
			i++
			pending = &protocol.Frame{Type: protocol.TypeSend, ConvID: convs[i%len(convs)],
				ClientMsgID: fmt.Sprintf("%s-%d", user, i), Body: fmt.Sprintf("%s says %d", user, i)}
		}
		if ctx.Err() != nil {
			got.fail("sender %s: %s still unacknowledged when the test's time ran out", user, pending.ClientMsgID)
			return
		}
		if rc == nil {
			gws := c.Gateways
			g := gws[gi%len(gws)]
			gi++
			var err error
			if rc, err = dialRaw(c, g, user, "storm"); err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		r, err := rc.call(*pending, 3*time.Second)
		if err != nil {
			got.retried()
			rc.close()
			rc = nil
			continue
		}
		switch {
		case r.Type == protocol.TypeAck:
			if r.ClientMsgID != pending.ClientMsgID || r.ConvID != pending.ConvID {
				got.fail("sender %s: ack %s answers send %s in conv %d", user, frameString(r), pending.ClientMsgID, pending.ConvID)
			}
			got.record(pending.ConvID, r.Seq, pending.ClientMsgID)
			pending = nil
		case r.Type == protocol.TypeError && r.Code.Retryable():
			got.retried()
			time.Sleep(time.Duration(min(max(r.RetryAfter, 20), 500)) * time.Millisecond)
		default:
			got.fail("sender %s: send %s answered %s", user, pending.ClientMsgID, frameString(r))
			pending = nil
		}
	}
}

func hashString(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// readHistory reads the whole of conv as user, through any gateway that
// answers, retrying for up to 30s.
func readHistory(c *Cluster, user string, conv uint64) ([]protocol.Message, error) {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for i := 0; time.Now().Before(deadline); i++ {
		g := c.Gateways[i%len(c.Gateways)]
		msgs, err := readHistoryOnce(c, g, user, conv)
		if err == nil {
			return msgs, nil
		}
		var perm permanentError
		if errors.As(err, &perm) {
			return nil, err
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return nil, fmt.Errorf("history of conv %d as %s: %w", conv, user, last)
}

type permanentError struct{ error }

func readHistoryOnce(c *Cluster, g *Proc, user string, conv uint64) ([]protocol.Message, error) {
	rc, err := dialRaw(c, g, user, "reader")
	if err != nil {
		return nil, err
	}
	defer rc.close()
	var out []protocol.Message
	after := uint64(0)
	for {
		r, err := rc.call(protocol.Frame{Type: protocol.TypeHistory, ConvID: conv, AfterSeq: &after, Limit: 200}, 10*time.Second)
		if err != nil {
			return nil, err
		}
		if r.Type == protocol.TypeError {
			if r.Code.Retryable() {
				return nil, fmt.Errorf("history: %s", frameString(r))
			}
			return nil, permanentError{fmt.Errorf("history: %s", frameString(r))}
		}
		out = append(out, r.Messages...)
		if !r.HasMore || len(r.Messages) == 0 {
			return out, nil
		}
		after = out[len(out)-1].Seq
	}
}

// histories reads every conversation of cs in full.
func histories(t *testing.T, c *Cluster, cs convSet) map[uint64][]protocol.Message {
	t.Helper()
	out := make(map[uint64][]protocol.Message)
	for conv, members := range cs.members {
		msgs, err := readHistory(c, members[0], conv)
		if err != nil {
			t.Fatal(err)
		}
		out[conv] = msgs
	}
	return out
}

// verifyStored checks the stored conversations against what was
// acknowledged: seqs dense from 1, no client_msg_id stored twice by one
// sender, every acknowledged message stored once at its acknowledged seq.
func verifyStored(t *testing.T, hist map[uint64][]protocol.Message, got *acked) {
	t.Helper()
	got.mu.Lock()
	defer got.mu.Unlock()
	if len(got.errs) > 0 {
		t.Fatalf("%d problems while sending:\n%s", len(got.errs), strings.Join(got.errs, "\n"))
	}
	total := 0
	for conv, seqs := range got.seqs {
		stored, ok := hist[conv]
		if !ok {
			t.Fatalf("conv %d: acknowledged messages but its history was not read", conv)
		}
		byID := make(map[string]uint64, len(stored))
		for i, m := range stored {
			if m.Seq != uint64(i+1) {
				t.Fatalf("conv %d: stored message #%d has seq %d: seqs not dense (lost or duplicated seq)", conv, i+1, m.Seq)
			}
			if m.ClientMsgID == "" {
				continue // system events
			}
			key := m.Sender + "/" + m.ClientMsgID
			if prev, dup := byID[key]; dup {
				t.Fatalf("conv %d: client_msg_id %q of %s stored twice (seq %d and %d)", conv, m.ClientMsgID, m.Sender, prev, m.Seq)
			}
			byID[key] = m.Seq
		}
		for seq, cmid := range seqs {
			if seq == 0 || seq > uint64(len(stored)) {
				t.Fatalf("conv %d: %q acknowledged at seq %d, but the conversation stores seqs 1..%d", conv, cmid, seq, len(stored))
			}
			if m := stored[seq-1]; m.ClientMsgID != cmid {
				t.Fatalf("conv %d: seq %d acknowledged for %q but stores %q (sender %s)", conv, seq, cmid, m.ClientMsgID, m.Sender)
			}
			total++
		}
	}
	if total == 0 {
		t.Fatal("no message was acknowledged")
	}
	t.Logf("%d acknowledged messages stored exactly once at their seq in %d conversations (%d raw sends retried)", total, len(got.seqs), got.retries)
}

// sortedKeys returns m's keys in order, for stable failure messages.
func sortedKeys[V any](m map[uint64]V) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
