package faulttest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

// Tier thresholds of the runs: groups of 3 and 4 are small (3 get rows in
// the message's write), 6 medium, 9 large.
const (
	smallBelow = 5
	largeAbove = 8
)

// run drives ops random operations against tgt, then checks.
func run(t *testing.T, tgt target, sd uint64, ops, crashes int) {
	w := &world{t: t, rng: rand.New(rand.NewPCG(sd, sd^0x9e3779b97f4a7c15)), tgt: tgt,
		devs: map[string][]*device{}, byID: map[uint64]*convModel{},
		reads: map[string]map[uint64]uint64{}, texts: map[string][]*msgRec{},
		own: map[string]map[uint64]uint64{}, ownMax: map[string]map[uint64]uint64{}}
	w.setup()
	faultsLeft := 0
	for w.step = 1; w.step <= ops; w.step++ {
		if faultsLeft > 0 {
			if faultsLeft--; faultsLeft == 0 {
				tgt.faults(false)
			}
		}
		switch r := w.rng.IntN(100); {
		case r < 55:
			if w.send() && crashes > 0 && w.rng.IntN(100) < 3 {
				// Right after an ACK: the fan-out is queued, maybe not run.
				crashes--
				w.crash()
			}
		case r < 61:
			w.edit(false)
		case r < 64:
			w.edit(true)
		case r < 69:
			w.add()
		case r < 72:
			w.remove(false)
		case r < 75:
			w.remove(true)
		case r < 85:
			w.read()
		case r < 91:
			d := w.anyDevice()
			d.close()
		case r < 95:
			for _, ds := range w.devs {
				for _, d := range ds {
					if !d.connected() && w.rng.IntN(2) == 0 {
						_ = d.connect()
					}
				}
			}
		case r < 99:
			if faultsLeft == 0 {
				faultsLeft = 5 + w.rng.IntN(15)
				tgt.faults(true)
			}
		default:
			if crashes > 0 {
				crashes--
				w.crash()
			}
		}
	}
	tgt.faults(false)
	w.step++
	for _, ds := range w.devs {
		for _, d := range ds {
			if !d.connected() {
				if err := d.connect(); err != nil {
					t.Fatalf("reconnect %s/%s: %v", d.user, d.id, err)
				}
			}
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		problems := w.verify()
		if len(problems) == 0 {
			n := 0
			for _, c := range w.convs {
				n += len(c.msgs)
			}
			t.Logf("%d operations, %d acknowledged messages in %d conversations, %d restarts: all visible and counted right", ops, n, len(w.convs), w.incarnation)
			break
		}
		if time.Now().After(deadline) {
			if len(problems) > 30 {
				problems = append(problems[:30], fmt.Sprintf("... and %d more", len(problems)-30))
			}
			t.Fatalf("after %d operations (%d restarts), still wrong once fan-out settled:\n%s", ops, w.incarnation, strings.Join(problems, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, ds := range w.devs {
		for _, d := range ds {
			d.close()
		}
	}
}

func (w *world) setup() {
	for i := range 10 {
		u := fmt.Sprintf("u%d", i)
		w.users = append(w.users, u)
		w.reads[u] = map[uint64]uint64{}
		w.own[u] = map[uint64]uint64{}
		w.ownMax[u] = map[uint64]uint64{}
		for _, id := range []string{"phone", "laptop"} {
			d := &device{w: w, user: u, id: id}
			if err := d.connect(); err != nil {
				w.t.Fatalf("connect %s: %v", u, err)
			}
			w.devs[u] = append(w.devs[u], d)
		}
	}
	for _, p := range [][2]string{{"u0", "u1"}, {"u2", "u3"}, {"u4", "u5"}, {"u1", "u6"}} {
		r := w.devs[p[0]][0].must(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: p[1]})
		if r.Type != protocol.TypeConv || r.Conv == nil {
			w.t.Fatalf("open_direct: %+v", r)
		}
		w.addConv(r.Conv.ConvID, false, p[0], p[0], p[1])
	}
	for _, g := range [][]string{
		{"u0", "u1", "u2"},
		{"u3", "u4", "u5", "u6"},
		{"u6", "u7", "u8", "u9", "u0", "u1"},
		{"u9", "u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"},
	} {
		r := w.devs[g[0]][0].must(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "g", Members: g[1:]})
		if r.Type != protocol.TypeConv || r.Conv == nil {
			w.t.Fatalf("create_group: %+v", r)
		}
		w.addConv(r.Conv.ConvID, true, g[0], g...)
	}
}

func (w *world) addConv(id uint64, group bool, owner string, users ...string) {
	w.modelMu.Lock()
	defer w.modelMu.Unlock()
	c := &convModel{id: id, group: group, owner: owner, members: map[string]*membership{}, msgs: map[uint64]*msgRec{}}
	for _, u := range users {
		c.members[u] = &membership{}
	}
	w.convs = append(w.convs, c)
	w.byID[id] = c
}

func (w *world) anyDevice() *device {
	ds := w.devs[w.users[w.rng.IntN(len(w.users))]]
	return ds[w.rng.IntN(len(ds))]
}

// pick returns a random current member of a random conversation.
func (w *world) pick(groupOnly bool) (*convModel, string) {
	for range 50 {
		c := w.convs[w.rng.IntN(len(w.convs))]
		if groupOnly && !c.group {
			continue
		}
		cur := c.current()
		if len(cur) > 0 {
			return c, cur[w.rng.IntN(len(cur))]
		}
	}
	return nil, ""
}

func (w *world) nextCMID() string {
	w.cmid++
	return fmt.Sprintf("c%d", w.cmid)
}

func (w *world) record(c *convModel, r *protocol.Frame, m *msgRec) {
	if r.Type != protocol.TypeAck {
		w.t.Fatalf("step %d: %s in conv %d answered %s %s (%s)", w.step, m.kind, c.id, r.Type, r.Code, r.Error)
	}
	m.conv, m.seq, m.step = c.id, r.Seq, w.step
	w.modelMu.Lock()
	defer w.modelMu.Unlock()
	if prev := c.msgs[r.Seq]; prev != nil && prev.cmid != m.cmid {
		w.t.Fatalf("step %d: seq %d of conv %d acknowledged for %s and %s", w.step, r.Seq, c.id, prev.cmid, m.cmid)
	}
	c.msgs[r.Seq] = m
	w.own[m.sender][c.id] = max(w.own[m.sender][c.id], r.Seq)
	w.ownMax[m.sender][c.id] = max(w.ownMax[m.sender][c.id], r.Seq)
}

// ownEvent records that user caused a membership event in c just now: its
// seq is at most the conversation's last seq, read by user if it is still
// a member (a leaver's bound is its leave_seq, known at verify).
func (w *world) ownEvent(c *convModel, user string) {
	r := w.devs[user][0].must(protocol.Frame{Type: protocol.TypeConvInfo, ConvID: c.id})
	if r.Type != protocol.TypeConv {
		w.t.Fatalf("step %d: conv_info of %d for %s: %s %s", w.step, c.id, user, r.Code, r.Error)
	}
	w.ownMax[user][c.id] = max(w.ownMax[user][c.id], r.Conv.LastSeq)
}

// send stores a text message, sometimes with mentions; it reports whether
// one was acknowledged.
func (w *world) send() bool {
	c, u := w.pick(false)
	if c == nil {
		return false
	}
	d := w.devs[u][w.rng.IntN(2)]
	m := &msgRec{sender: u, device: d.id, kind: protocol.KindText, cmid: w.nextCMID()}
	m.body = "hello " + m.cmid
	f := protocol.Frame{Type: protocol.TypeSend, ConvID: c.id, ClientMsgID: m.cmid, Body: m.body}
	switch n := w.rng.IntN(100); {
	case n < 20:
		for range 1 + w.rng.IntN(2) {
			m.mentions = append(m.mentions, w.users[w.rng.IntN(len(w.users))])
		}
		slices.Sort(m.mentions)
		m.mentions = slices.Compact(m.mentions)
		f.Mentions = m.mentions
	case n < 25 && c.group:
		m.mentionAll, f.MentionAll = true, true
	}
	w.record(c, d.must(f), m)
	w.texts[u] = append(w.texts[u], m)
	return true
}

// edit edits or recalls one of a sender's messages.
func (w *world) edit(recall bool) {
	u := w.users[w.rng.IntN(len(w.users))]
	var cands []*msgRec
	for _, m := range w.texts[u] {
		if !m.recalled && w.byID[m.conv].members[u].leftStep == 0 {
			cands = append(cands, m)
		}
	}
	if len(cands) == 0 {
		return
	}
	target := cands[w.rng.IntN(len(cands))]
	c := w.byID[target.conv]
	d := w.devs[u][w.rng.IntN(2)]
	ev := &msgRec{sender: u, device: d.id, cmid: w.nextCMID()}
	f := protocol.Frame{ConvID: c.id, ClientMsgID: ev.cmid, TargetSeq: target.seq}
	if recall {
		f.Type, ev.kind = protocol.TypeRecall, "recall"
	} else {
		f.Type, ev.kind, f.Body = protocol.TypeEdit, "edit", "edited "+ev.cmid
	}
	w.record(c, d.must(f), ev)
	w.modelMu.Lock()
	defer w.modelMu.Unlock()
	if recall {
		target.recalled, target.body = true, ""
	} else {
		if len(target.versions) == 0 {
			target.orig = target.body
		}
		target.edited, target.body = true, f.Body
		target.versions = append(target.versions, version{at: ev.seq, body: f.Body})
	}
}

// add has a group's owner add a user who never was a member.
func (w *world) add() {
	c, _ := w.pick(true)
	if c == nil || c.members[c.owner].leftStep != 0 {
		return
	}
	var cands []string
	for _, u := range w.users {
		if c.members[u] == nil {
			cands = append(cands, u)
		}
	}
	if len(cands) == 0 {
		return
	}
	u := cands[w.rng.IntN(len(cands))]
	ms := &membership{addStep: w.step}
	w.modelMu.Lock()
	c.members[u] = ms // before the answer: the new member's pushes may come first
	w.modelMu.Unlock()
	r := w.devs[c.owner][0].must(protocol.Frame{Type: protocol.TypeAddMembers, ConvID: c.id, Members: []string{u}})
	if r.Type != protocol.TypeConv {
		w.t.Fatalf("step %d: add %s to %d: %s %s", w.step, u, c.id, r.Code, r.Error)
	}
	ms.addDone = w.step
	w.ownEvent(c, c.owner)
}

// remove has the owner remove a member, or a member leave.
func (w *world) remove(leave bool) {
	c, u := w.pick(true)
	if c == nil || u == c.owner {
		return
	}
	ms := c.members[u]
	ms.leftStep = w.step
	var r *protocol.Frame
	if leave {
		r = w.devs[u][0].must(protocol.Frame{Type: protocol.TypeLeave, ConvID: c.id})
	} else {
		r = w.devs[c.owner][0].must(protocol.Frame{Type: protocol.TypeRemove, ConvID: c.id, Members: []string{u}})
	}
	// A removal retried after a lost answer finds the user gone already.
	if r.Type == protocol.TypeError && !(leave && r.Code == protocol.CodeNotMember) && !(!leave && r.Code == protocol.CodeNotFound) {
		w.t.Fatalf("step %d: remove %s from %d: %s %s", w.step, u, c.id, r.Code, r.Error)
	}
	ms.leftDone = w.step
	if leave {
		ms.leftSelf = true
	} else {
		w.ownEvent(c, c.owner)
	}
}

// read moves a member's read position to the last acknowledged seq.
func (w *world) read() {
	c, u := w.pick(false)
	if c == nil {
		return
	}
	var top uint64
	for s := range c.msgs {
		top = max(top, s)
	}
	if top == 0 {
		return
	}
	r := w.devs[u][w.rng.IntN(2)].must(protocol.Frame{Type: protocol.TypeRead, ConvID: c.id, Seq: top})
	if r.Type != protocol.TypeOK {
		w.t.Fatalf("step %d: read: %s %s", w.step, r.Code, r.Error)
	}
	w.reads[u][c.id] = max(w.reads[u][c.id], top)
}

// crash stops the server at once and starts it again; every device
// reconnects.
func (w *world) crash() {
	for _, ds := range w.devs {
		for _, d := range ds {
			d.close()
		}
	}
	w.tgt.crash()
	w.tgt.restart()
	w.incarnation++
	w.crashStep = w.step
	for _, ds := range w.devs {
		for _, d := range ds {
			if err := d.connect(); err != nil {
				w.t.Fatalf("reconnect after restart: %v", err)
			}
		}
	}
}

// verify compares every member device's view with the model and returns
// what disagrees.
func (w *world) verify() []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	for _, ds := range w.devs {
		for _, d := range ds {
			d.mu.Lock()
			for _, b := range d.bad {
				fail("%s/%s: %s", d.user, d.id, b)
			}
			d.mu.Unlock()
		}
	}
	for _, c := range w.convs {
		var maxAcked uint64
		for s := range c.msgs {
			maxAcked = max(maxAcked, s)
		}
		for u, ms := range c.members {
			list := w.devs[u][0].must(protocol.Frame{Type: protocol.TypeConvList})
			var sum *protocol.ConvSummary
			for i := range list.List {
				if list.List[i].ConvID == c.id {
					sum = &list.List[i]
				}
			}
			if sum == nil {
				fail("conv %d missing from %s's list", c.id, u)
				continue
			}
			J, L, T := sum.JoinSeq, sum.LeaveSeq, sum.LastSeq
			// Membership decided between the operation's issue and answer.
			for _, m := range c.msgs {
				switch {
				case ms.addStep != 0 && m.step < ms.addStep && m.seq >= J:
					fail("conv %d: %s joined at %d, but seq %d was acknowledged before the add", c.id, u, J, m.seq)
				case ms.addStep != 0 && m.step > ms.addDone && m.seq < J:
					fail("conv %d: %s joined at %d, but seq %d was sent after the add", c.id, u, J, m.seq)
				case ms.leftStep != 0 && m.step < ms.leftStep && m.seq > L:
					fail("conv %d: %s left at %d, but seq %d was acknowledged before", c.id, u, L, m.seq)
				case ms.leftStep != 0 && m.step > ms.leftDone && m.seq <= L:
					fail("conv %d: %s left at %d, but seq %d was sent after", c.id, u, L, m.seq)
				}
			}
			switch {
			case ms.addStep == 0 && J != 1:
				fail("conv %d: founding member %s has join_seq %d", c.id, u, J)
			case ms.leftStep == 0 && L != 0:
				fail("conv %d: %s has leave_seq %d but never left", c.id, u, L)
			case ms.leftStep != 0 && (L == 0 || T != L):
				fail("conv %d: %s left: leave_seq %d, last_seq %d", c.id, u, L, T)
			case ms.leftStep == 0 && T < maxAcked:
				fail("conv %d: %s's list says last_seq %d, below the acknowledged %d", c.id, u, T, maxAcked)
			}
			// Unread and mention flag, from the read position the server
			// holds (a crash may lose unsynced positions, never raise them).
			// The user's own messages and events moved it too.
			read := sum.ReadSeq
			low := max(w.reads[u][c.id], w.own[u][c.id])
			high := max(low, w.ownMax[u][c.id])
			if ms.leftSelf {
				high = max(high, L)
			}
			if read > high || (read < low && w.crashStep == 0) {
				fail("conv %d: %s's read_seq %d, want %d..%d (read up to %d, own messages up to %d)", c.id, u, read, low, high, w.reads[u][c.id], w.own[u][c.id])
			}
			floor := max(J, 1) - 1
			if want := T - min(max(read, floor), T); sum.Unread != want {
				fail("conv %d: %s's unread %d, want %d (last %d read %d join %d)", c.id, u, sum.Unread, want, T, read, J)
			}
			mentioned := false
			for _, m := range c.msgs {
				if m.kind == protocol.KindText && m.seq > read && m.seq <= T && m.seq >= J && (m.mentionAll || slices.Contains(m.mentions, u)) {
					mentioned = true
				}
			}
			if sum.Mentioned != mentioned {
				fail("conv %d: %s's mentioned = %v, want %v (read %d, last %d)", c.id, u, sum.Mentioned, mentioned, read, T)
			}
			// Every device: sync and history hold exactly J..T.
			after := J - 1
			for _, d := range w.devs[u] {
				snap := d.must(protocol.Frame{Type: protocol.TypeSync, Convs: []protocol.SyncConv{{ConvID: c.id, AfterSeq: after}}})
				var got []protocol.Message
				for _, s := range snap.Snapshot {
					if s.ConvID == c.id {
						if s.LastSeq != T {
							fail("conv %d: %s/%s sync last_seq %d, list %d", c.id, u, d.id, s.LastSeq, T)
						}
						got = s.Messages
					}
				}
				w.compare(&bad, c, fmt.Sprintf("%s/%s sync", u, d.id), got, J, T, L)
				h := d.must(protocol.Frame{Type: protocol.TypeHistory, ConvID: c.id, AfterSeq: &after, Limit: 200})
				w.compare(&bad, c, fmt.Sprintf("%s/%s history", u, d.id), h.Messages, J, T, L)
				w.checkPushes(&bad, d, c, J, L, T)
			}
			// The HTTP snapshot agrees.
			hs, err := w.httpSnapshot(u, c.id, after)
			if err != nil {
				fail("conv %d: %s's HTTP snapshot: %v", c.id, u, err)
			} else {
				var got []protocol.Message
				for _, s := range hs {
					if s.ConvID == c.id {
						got = s.Messages
					}
				}
				w.compare(&bad, c, u+" HTTP snapshot", got, J, T, L)
			}
		}
	}
	return bad
}

// compare checks msgs is exactly seqs from..to, each acknowledged one as
// acknowledged and in its final state as of leave (0: a current member).
func (w *world) compare(bad *[]string, c *convModel, who string, msgs []protocol.Message, from, to, leave uint64) {
	want := to - min(to, max(from, 1)-1)
	if uint64(len(msgs)) != want {
		*bad = append(*bad, fmt.Sprintf("conv %d: %s has %d messages, want seqs %d..%d", c.id, who, len(msgs), from, to))
	}
	for i, m := range msgs {
		if exp := max(from, 1) + uint64(i); m.Seq != exp {
			*bad = append(*bad, fmt.Sprintf("conv %d: %s: message %d has seq %d, want %d", c.id, who, i, m.Seq, exp))
			return
		}
		rec := c.msgs[m.Seq]
		if rec == nil {
			if m.Kind != protocol.KindSystem {
				*bad = append(*bad, fmt.Sprintf("conv %d: %s: seq %d is %s %q, never acknowledged", c.id, who, m.Seq, m.Kind, m.ClientMsgID))
			}
			continue
		}
		switch {
		case m.ClientMsgID != rec.cmid || m.Sender != rec.sender:
			*bad = append(*bad, fmt.Sprintf("conv %d: %s: seq %d is %s/%s, acknowledged for %s/%s", c.id, who, m.Seq, m.Sender, m.ClientMsgID, rec.sender, rec.cmid))
		case rec.kind == protocol.KindText:
			body, edited, recalled := rec.asOf(leave)
			if m.Recalled != recalled || m.Edited != edited || m.Body != body {
				*bad = append(*bad, fmt.Sprintf("conv %d: %s: seq %d reads %q edited=%v recalled=%v, want %q %v %v (leave_seq %d)", c.id, who, m.Seq, m.Body, m.Edited, m.Recalled, body, edited, recalled, leave))
			}
		}
	}
}

// checkPushes: a device connected since before a message was sent, on
// this incarnation of the server, got it pushed; no device got a push
// outside its member's range.
func (w *world) checkPushes(bad *[]string, d *device, c *convModel, J, L, T uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for s := range d.seen[c.id] {
		if s < J || (L != 0 && s > L) {
			*bad = append(*bad, fmt.Sprintf("conv %d: %s/%s was pushed seq %d outside [%d, %d]", c.id, d.user, d.id, s, J, L))
		}
	}
	if d.ws == nil || d.inc != w.incarnation {
		return
	}
	for _, m := range c.msgs {
		if m.step <= d.since || m.seq < J || m.seq > T || (m.sender == d.user && m.device == d.id) {
			continue
		}
		if d.got[c.id][m.seq] == 0 {
			var got []uint64
			for s := range d.got[c.id] {
				got = append(got, s)
			}
			slices.Sort(got)
			*bad = append(*bad, fmt.Sprintf("conv %d (%d members now): %s/%s, online since step %d, never got seq %d (sent at step %d by %s/%s); got %v", c.id, len(c.current()), d.user, d.id, d.since, m.seq, m.step, m.sender, m.device, got))
		}
	}
}

func (w *world) httpSnapshot(user string, conv, after uint64) ([]protocol.ConvSnapshot, error) {
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://%s/v1/conversations/snapshot?conv_ids=%d&from_seq=%d", w.tgt.url(), conv, after), nil)
	req.Header.Set("Authorization", "Bearer "+w.tgt.token(user))
	for i := 0; ; i++ {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		var out struct {
			Snapshot []protocol.ConvSnapshot `json:"snapshot"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && err == nil {
			return out.Snapshot, nil
		}
		if i == 20 {
			return nil, fmt.Errorf("status %d: %v", resp.StatusCode, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
