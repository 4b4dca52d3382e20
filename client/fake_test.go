package client

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-im/parley/protocol"
)

// fakeServer speaks the wire protocol of /work/notes/wire.md from memory, so
// the client's ordering, retry and reconnect logic can be tested without the
// real server and with faults injected where the real one cannot be made to
// fail. The token is the user id; "bad" is refused.
type fakeServer struct {
	t   *testing.T
	srv *httptest.Server
	URL string

	heartbeatMS int64

	mu        sync.Mutex
	convs     map[uint64]*fakeConv
	nextConv  uint64
	nextMsgID uint64
	read      map[string]map[uint64]uint64 // user → conv → read seq
	delivered map[string]map[uint64]uint64 // user/device → conv → seq
	dedupe    map[string]*protocol.Frame   // user/conv/client_msg_id → ack
	conns     map[*fakeConn]bool
	received  []protocol.Frame // every client frame, in arrival order
	// dropPush, when set, loses the push of m to user/device.
	dropPush func(user, device string, m protocol.Message) bool
	// intercept, when set, sees each client frame first; true means it
	// handled it.
	intercept func(fc *fakeConn, f *protocol.Frame) bool
	// refuse, when set, may answer the handshake instead of upgrading.
	refuse func(w http.ResponseWriter, r *http.Request) bool
	dials  int
}

type fakeConv struct {
	id      uint64
	kind    string
	name    string
	members map[string]uint64 // user → join_seq
	log     []protocol.Message
}

type fakeConn struct {
	user, device string
	ws           *websocket.Conn
	wmu          sync.Mutex
}

func (fc *fakeConn) send(f *protocol.Frame) {
	data, _ := json.Marshal(f)
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_ = fc.ws.WriteMessage(websocket.TextMessage, data)
}

func (fc *fakeConn) closeWith(code int, text string) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	_ = fc.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
	_ = fc.ws.Close()
}

func newFakeServer(t *testing.T) *fakeServer {
	fs := &fakeServer{
		t:           t,
		heartbeatMS: 10000,
		convs:       make(map[uint64]*fakeConv),
		read:        make(map[string]map[uint64]uint64),
		delivered:   make(map[string]map[uint64]uint64),
		dedupe:      make(map[string]*protocol.Frame),
		conns:       make(map[*fakeConn]bool),
	}
	fs.srv = httptest.NewServer(http.HandlerFunc(fs.handle))
	fs.URL = "ws" + strings.TrimPrefix(fs.srv.URL, "http")
	t.Cleanup(fs.close)
	return fs
}

func (fs *fakeServer) close() {
	fs.mu.Lock()
	for fc := range fs.conns {
		_ = fc.ws.Close()
	}
	fs.mu.Unlock()
	fs.srv.Close()
}

func (fs *fakeServer) handle(w http.ResponseWriter, r *http.Request) {
	fs.mu.Lock()
	fs.dials++
	refuse := fs.refuse
	fs.mu.Unlock()
	if refuse != nil && refuse(w, r) {
		return
	}
	user := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if user == "" || user == "bad" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"code":"unauthorized","error":"bad token"}`))
		return
	}
	device := r.URL.Query().Get("device")
	if r.URL.Path != "/v1/ws" || !protocol.ValidID(device) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"code":"invalid_argument","error":"bad device"}`))
		return
	}
	ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	fc := &fakeConn{user: user, device: device, ws: ws}
	fc.send(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{
		Protocol: protocol.Version, SessionID: "s", UserID: user, DeviceID: device, Node: "fake",
		HeartbeatMS: fs.heartbeatMS, IdleTimeoutMS: 3 * fs.heartbeatMS, Limits: protocol.DefaultLimits,
	}})
	fs.mu.Lock()
	fs.conns[fc] = true
	fs.mu.Unlock()
	defer func() {
		fs.mu.Lock()
		delete(fs.conns, fc)
		fs.mu.Unlock()
		_ = ws.Close()
	}()
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return
		}
		f, perr := protocol.DecodeClient(data, protocol.DefaultLimits)
		if perr != nil {
			fc.send(&protocol.Frame{Type: protocol.TypeError, RID: f.RID, Code: perr.Code, Error: perr.Msg})
			continue
		}
		fs.mu.Lock()
		fs.received = append(fs.received, *f)
		intercept := fs.intercept
		fs.mu.Unlock()
		if intercept != nil && intercept(fc, f) {
			continue
		}
		fs.serve(fc, f)
	}
}

func errFrame(rid string, code protocol.Code, msg string) *protocol.Frame {
	return &protocol.Frame{Type: protocol.TypeError, RID: rid, Code: code, Error: msg}
}

// serve answers one valid client frame the way the real server does.
func (fs *fakeServer) serve(fc *fakeConn, f *protocol.Frame) {
	switch f.Type {
	case protocol.TypePing:
		fc.send(&protocol.Frame{Type: protocol.TypePong, RID: f.RID, ServerTime: time.Now().UnixMilli()})
	case protocol.TypeSend, protocol.TypeEdit, protocol.TypeRecall:
		ack, e := fs.store(fc.user, fc.device, f)
		if e != nil {
			fc.send(e)
			return
		}
		fc.send(ack)
	case protocol.TypeDelivered, protocol.TypeRead:
		fs.mu.Lock()
		table := fs.delivered
		key := fc.user + "/" + fc.device
		if f.Type == protocol.TypeRead {
			table, key = fs.read, fc.user
		}
		if table[key] == nil {
			table[key] = make(map[uint64]uint64)
		}
		table[key][f.ConvID] = max(table[key][f.ConvID], f.Seq)
		fs.mu.Unlock()
		if f.RID != "" {
			fc.send(&protocol.Frame{Type: protocol.TypeOK, RID: f.RID})
		}
	case protocol.TypeSync:
		fc.send(&protocol.Frame{Type: protocol.TypeSnapshot, RID: f.RID, Snapshot: fs.snapshot(fc.user, f)})
	case protocol.TypeHistory:
		fc.send(fs.history(fc.user, f))
	case protocol.TypeConvList:
		fc.send(&protocol.Frame{Type: protocol.TypeConvList, RID: f.RID, List: fs.list(fc.user)})
	case protocol.TypeOpenDirect:
		fc.send(&protocol.Frame{Type: protocol.TypeConv, RID: f.RID, Conv: fs.openDirect(fc.user, f.Peer)})
	case protocol.TypeCreateGroup:
		fc.send(&protocol.Frame{Type: protocol.TypeConv, RID: f.RID, Conv: fs.createGroup(fc.user, f.Name, f.Members)})
	default:
		fc.send(errFrame(f.RID, protocol.CodeUnknownType, f.Type))
	}
}

func (fs *fakeServer) store(user, device string, f *protocol.Frame) (*protocol.Frame, *protocol.Frame) {
	fs.mu.Lock()
	c := fs.convs[f.ConvID]
	if c == nil {
		fs.mu.Unlock()
		return nil, errFrame(f.RID, protocol.CodeNotFound, "no such conversation")
	}
	if _, ok := c.members[user]; !ok {
		fs.mu.Unlock()
		return nil, errFrame(f.RID, protocol.CodeNotMember, "not a member")
	}
	key := user + "/" + f.Type + "/" + f.ClientMsgID
	if prev := fs.dedupe[key]; prev != nil {
		fs.mu.Unlock()
		dup := *prev
		dup.RID, dup.Duplicate = f.RID, true
		return &dup, nil
	}
	fs.nextMsgID++
	m := protocol.Message{ConvID: c.id, Seq: uint64(len(c.log)) + 1, MsgID: fs.nextMsgID, Sender: user, SenderDevice: device,
		ClientMsgID: f.ClientMsgID, Kind: f.Kind, Body: f.Body, TargetSeq: f.TargetSeq, ServerTime: time.Now().UnixMilli()}
	c.log = append(c.log, m)
	ack := &protocol.Frame{Type: protocol.TypeAck, ConvID: c.id, ClientMsgID: f.ClientMsgID, Seq: m.Seq, MsgID: m.MsgID, ServerTime: m.ServerTime}
	fs.dedupe[key] = ack
	fs.mu.Unlock()
	fs.push(c, m)
	out := *ack
	out.RID = f.RID
	return &out, nil
}

// appendMessage stores a message from user without a client connection.
func (fs *fakeServer) appendMessage(convID uint64, user, body string) protocol.Message {
	fs.mu.Lock()
	c := fs.convs[convID]
	fs.nextMsgID++
	m := protocol.Message{ConvID: c.id, Seq: uint64(len(c.log)) + 1, MsgID: fs.nextMsgID, Sender: user,
		Kind: protocol.KindText, Body: body, ServerTime: time.Now().UnixMilli()}
	c.log = append(c.log, m)
	fs.mu.Unlock()
	fs.push(c, m)
	return m
}

func (fs *fakeServer) push(c *fakeConv, m protocol.Message) {
	fs.mu.Lock()
	var to []*fakeConn
	for fc := range fs.conns {
		if join, ok := c.members[fc.user]; ok && m.Seq >= join && (fs.dropPush == nil || !fs.dropPush(fc.user, fc.device, m)) {
			to = append(to, fc)
		}
	}
	fs.mu.Unlock()
	for _, fc := range to {
		mm := m
		fc.send(&protocol.Frame{Type: protocol.TypeMsg, Message: &mm})
	}
}

func (fs *fakeServer) snapshot(user string, f *protocol.Frame) []protocol.ConvSnapshot {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	from := make(map[uint64]uint64)
	for _, sc := range f.Convs {
		from[sc.ConvID] = sc.AfterSeq
	}
	var out []protocol.ConvSnapshot
	for _, c := range fs.convs {
		join, member := c.members[user]
		if !member {
			continue
		}
		start, listed := from[c.id]
		if !listed {
			if !f.All {
				continue
			}
			start = fs.read[user][c.id]
		}
		start = max(start, join-1)
		last := uint64(len(c.log))
		if last <= start {
			continue
		}
		s := protocol.ConvSnapshot{ConvID: c.id, Kind: c.kind, LastSeq: last, ReadSeq: fs.read[user][c.id], JoinSeq: join,
			FromSeq: start, Unread: last - max(fs.read[user][c.id], join-1)}
		lo := start + 1
		if gap := last - start; gap > 200 {
			lo = last - 49
			s.MoreUnread = gap - 50
		}
		s.Messages = append([]protocol.Message(nil), c.log[lo-1:last]...)
		out = append(out, s)
	}
	return out
}

func (fs *fakeServer) history(user string, f *protocol.Frame) *protocol.Frame {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	c := fs.convs[f.ConvID]
	if c == nil {
		return errFrame(f.RID, protocol.CodeNotFound, "no such conversation")
	}
	join, ok := c.members[user]
	if !ok {
		return errFrame(f.RID, protocol.CodeNotMember, "not a member")
	}
	limit := uint64(f.Limit)
	if limit == 0 {
		limit = 50
	}
	last := uint64(len(c.log))
	first := max(join, 1)
	out := &protocol.Frame{Type: protocol.TypeHistory, RID: f.RID, ConvID: c.id}
	var lo, hi uint64 // inclusive range
	switch {
	case f.AfterSeq != nil:
		lo = max(*f.AfterSeq+1, first)
		hi = min(last, lo+limit-1)
		out.HasMore = hi < last
	default:
		hi = last
		if f.BeforeSeq != 0 {
			hi = min(last, f.BeforeSeq-1)
		}
		lo = first
		if hi >= limit && hi-limit+1 > lo {
			lo = hi - limit + 1
		}
		out.HasMore = lo > first
	}
	if lo <= hi && hi >= 1 {
		out.Messages = append([]protocol.Message(nil), c.log[lo-1:hi]...)
	}
	return out
}

func (fs *fakeServer) list(user string) []protocol.ConvSummary {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []protocol.ConvSummary
	for _, c := range fs.convs {
		join, ok := c.members[user]
		if !ok {
			continue
		}
		last, read := uint64(len(c.log)), fs.read[user][c.id]
		s := protocol.ConvSummary{ConvID: c.id, Kind: c.kind, Name: c.name, LastSeq: last, ReadSeq: read, JoinSeq: join}
		if base := max(read, join-1); last > base {
			s.Unread = last - base
		}
		out = append(out, s)
	}
	return out
}

func (fs *fakeServer) openDirect(user, peer string) *protocol.ConvInfo {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, c := range fs.convs {
		_, a := c.members[user]
		_, b := c.members[peer]
		if c.kind == protocol.ConvDirect && a && b {
			return fs.info(c)
		}
	}
	return fs.info(fs.newConvLocked(protocol.ConvDirect, "", user, peer))
}

func (fs *fakeServer) createGroup(user, name string, members []string) *protocol.ConvInfo {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.info(fs.newConvLocked(protocol.ConvGroup, name, append([]string{user}, members...)...))
}

// newConv creates a conversation whose members all join at seq 1.
func (fs *fakeServer) newConv(kind string, members ...string) uint64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.newConvLocked(kind, "", members...).id
}

func (fs *fakeServer) newConvLocked(kind, name string, members ...string) *fakeConv {
	fs.nextConv++
	c := &fakeConv{id: fs.nextConv, kind: kind, name: name, members: make(map[string]uint64)}
	for _, m := range members {
		c.members[m] = 1
	}
	fs.convs[c.id] = c
	return c
}

func (fs *fakeServer) info(c *fakeConv) *protocol.ConvInfo {
	ci := &protocol.ConvInfo{ConvID: c.id, Kind: c.kind, Name: c.name, LastSeq: uint64(len(c.log)), JoinSeq: 1}
	for m := range c.members {
		ci.Members = append(ci.Members, m)
	}
	return ci
}

// conn returns the live connection of user/device, if any.
func (fs *fakeServer) conn(user, device string) *fakeConn {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for fc := range fs.conns {
		if fc.user == user && fc.device == device {
			return fc
		}
	}
	return nil
}

func (fs *fakeServer) logLen(convID uint64) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.convs[convID].log)
}

func (fs *fakeServer) frames(typ string) []protocol.Frame {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []protocol.Frame
	for _, f := range fs.received {
		if f.Type == typ {
			out = append(out, f)
		}
	}
	return out
}

func (fs *fakeServer) deliveredSeq(user, device string, convID uint64) uint64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.delivered[user+"/"+device][convID]
}
