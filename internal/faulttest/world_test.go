package faulttest

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

var seedFlag = flag.Uint64("fault.seed", 0, "seed of the randomized fault tests (0: PARLEY_FAULT_SEED, else from the clock)")

// seed returns the run's seed and prints how to repeat it.
func seed(t *testing.T) uint64 {
	s := *seedFlag
	if s == 0 {
		if v := os.Getenv("PARLEY_FAULT_SEED"); v != "" {
			var err error
			if s, err = strconv.ParseUint(v, 10, 64); err != nil {
				t.Fatalf("PARLEY_FAULT_SEED=%q: %v", v, err)
			}
		}
	}
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (repeat with PARLEY_FAULT_SEED=%d go test ./internal/faulttest -run '^%s$')", s, s, t.Name())
	return s
}

// target is the server under test.
type target interface {
	url() string // host:port
	token(user string) string
	crash() // stop at once: kill -9, or an in-process stop that abandons the fan-out queue
	restart()
	faults(on bool) // inject (or stop injecting) store, registry and bus faults
}

// msgRec is the model of one acknowledged message.
type msgRec struct {
	conv       uint64
	seq        uint64
	cmid       string
	sender     string
	device     string
	kind       string // text, edit, recall
	body       string
	mentions   []string
	mentionAll bool
	step       int // the driver step at which the send was issued
	edited     bool
	recalled   bool
	// versions are the edits of a text message in order: the edit's seq and
	// the body it set; orig is the body before the first edit. A former
	// member reads the message as of its leave_seq (docs/protocol.md).
	versions []version
	orig     string
}

// version is one edit of a message: at the edit event's seq, the new body.
type version struct {
	at   uint64
	body string
}

// asOf is what a member who left at leave (0: still a member) reads of a
// text message: a recall hides it whenever it came; an edit after leave is
// not shown.
func (m *msgRec) asOf(leave uint64) (body string, edited, recalled bool) {
	if m.recalled || leave == 0 {
		return m.body, m.edited, m.recalled
	}
	body = m.body
	if len(m.versions) > 0 {
		body = m.orig
	}
	for _, v := range m.versions {
		if v.at <= leave {
			body, edited = v.body, true
		}
	}
	return body, edited, false
}

// membership is one user's (single) membership of a conversation, bounded
// by the driver steps of the operations that made and ended it.
type membership struct {
	addStep, addDone   int  // issued, answered (0, 0: a founding member)
	leftStep, leftDone int  // 0: still a member
	leftSelf           bool // left by itself (its read position moved to leave_seq)
}

type convModel struct {
	id      uint64
	group   bool
	owner   string
	members map[string]*membership // every user who ever was a member
	msgs    map[uint64]*msgRec     // by seq
}

func (c *convModel) current() []string {
	var out []string
	for u, m := range c.members {
		if m.leftStep == 0 {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// world is the driver's model of what the server acknowledged.
type world struct {
	t     *testing.T
	rng   *rand.Rand
	tgt   target
	users []string
	devs  map[string][]*device
	convs []*convModel
	byID  map[uint64]*convModel
	step  int
	reads map[string]map[uint64]uint64 // user → conv → read position sent
	// own and ownMax bound what a user's own messages and events did to its
	// read position (docs/protocol.md, "Own messages are never unread"):
	// own is the highest acknowledged seq the user sent (the position is
	// at least that, barring a crash), ownMax also counts membership
	// events the user caused, whose seq is known only as the
	// conversation's last seq right after them.
	own, ownMax map[string]map[uint64]uint64
	texts       map[string][]*msgRec // sender → text messages it may edit
	cmid        int
	// incarnation is bumped at every restart.
	incarnation int
	crashStep   int // step of the last restart, 0 if none
	// modelMu guards convs, byID and members against the devices' readers.
	modelMu sync.Mutex
}

// device is one client connection of a user, reconnected as needed.
type device struct {
	w    *world
	user string
	id   string

	wmu sync.Mutex // serialises writes
	mu  sync.Mutex
	ws  *websocket.Conn
	// since is the driver step at which the current connection was
	// established, inc the server incarnation it was made to.
	since, inc int
	rid        int
	waiting    map[string]chan *protocol.Frame
	// got: conv → seq → pushes received on the current connection.
	got map[uint64]map[uint64]int
	// bad collects pushes to non-members; seen every pushed seq, across
	// connections, for the range check at the end. Guarded by mu.
	bad  []string
	seen map[uint64]map[uint64]bool
}

func (d *device) connected() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ws != nil
}

func (d *device) connect() error {
	h := http.Header{"Authorization": {"Bearer " + d.w.tgt.token(d.user)}}
	dl := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	ws, _, err := dl.Dial("ws://"+d.w.tgt.url()+"/v1/ws?device="+d.id, h)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.ws, d.since, d.inc = ws, d.w.step, d.w.incarnation
	d.waiting = map[string]chan *protocol.Frame{}
	d.got = map[uint64]map[uint64]int{}
	d.mu.Unlock()
	go d.read(ws)
	return nil
}

func (d *device) close() {
	d.mu.Lock()
	ws := d.ws
	d.ws = nil
	d.mu.Unlock()
	if ws != nil {
		_ = ws.Close()
	}
}

func (d *device) read(ws *websocket.Conn) {
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			d.mu.Lock()
			if d.ws == ws {
				d.ws = nil
				for _, ch := range d.waiting {
					close(ch)
				}
				d.waiting = nil
			}
			d.mu.Unlock()
			return
		}
		var f protocol.Frame
		if json.Unmarshal(data, &f) != nil {
			continue
		}
		if f.RID != "" {
			d.mu.Lock()
			if ch := d.waiting[f.RID]; ch != nil && d.ws == ws {
				delete(d.waiting, f.RID)
				ch <- &f
			}
			d.mu.Unlock()
			continue
		}
		if f.Type == protocol.TypeMsg && f.Message != nil {
			m := f.Message
			d.mu.Lock()
			if d.ws == ws {
				if d.got[m.ConvID] == nil {
					d.got[m.ConvID] = map[uint64]int{}
				}
				d.got[m.ConvID][m.Seq]++
			}
			if d.seen == nil {
				d.seen = map[uint64]map[uint64]bool{}
			}
			if d.seen[m.ConvID] == nil {
				d.seen[m.ConvID] = map[uint64]bool{}
			}
			d.seen[m.ConvID][m.Seq] = true
			d.mu.Unlock()
			d.w.checkPushRange(d, m)
			_ = d.write(ws, protocol.Frame{Type: protocol.TypeDelivered, ConvID: m.ConvID, Seq: m.Seq})
		}
	}
}

func (d *device) write(ws *websocket.Conn, f protocol.Frame) error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	_ = ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return ws.WriteJSON(f)
}

var errGone = errors.New("connection lost")

// call sends f and waits for its answer, connecting first if needed.
func (d *device) call(f protocol.Frame) (*protocol.Frame, error) {
	if !d.connected() {
		if err := d.connect(); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	ws := d.ws
	if ws == nil {
		d.mu.Unlock()
		return nil, errGone
	}
	d.rid++
	f.RID = strconv.Itoa(d.rid)
	ch := make(chan *protocol.Frame, 1)
	d.waiting[f.RID] = ch
	d.mu.Unlock()
	if err := d.write(ws, f); err != nil {
		d.close()
		return nil, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return nil, errGone
		}
		return r, nil
	case <-time.After(15 * time.Second):
		d.close()
		return nil, errors.New("no answer in 15s")
	}
}

// must calls until an answer that is not a retryable error arrives.
func (d *device) must(f protocol.Frame) *protocol.Frame {
	d.w.t.Helper()
	for i := 0; ; i++ {
		r, err := d.call(f)
		if err == nil && (r.Type != protocol.TypeError || !r.Code.Retryable()) {
			return r
		}
		if i == 200 {
			d.w.t.Fatalf("%s/%s: %s keeps failing: %v %+v", d.user, d.id, f.Type, err, r)
		}
		time.Sleep(time.Duration(10+i*5) * time.Millisecond)
	}
}

func (w *world) checkPushRange(d *device, m *protocol.Message) {
	w.modelMu.Lock()
	defer w.modelMu.Unlock()
	c := w.byID[m.ConvID]
	if c == nil {
		return // created this moment; the range check is at the end
	}
	if c.members[d.user] == nil {
		d.mu.Lock()
		d.bad = append(d.bad, fmt.Sprintf("push of conv %d seq %d to non-member %s", m.ConvID, m.Seq, d.user))
		d.mu.Unlock()
	}
}

// metric reads a gauge from the node's /metrics.
func metric(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	for _, line := range strings.Split(sb.String(), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}
