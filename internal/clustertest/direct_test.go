package clustertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// openKey is one pair's conversation of one kind.
type openKey struct {
	pair int
	e2e  bool
}

// opens collects the conversations answered per openKey.
type opens struct {
	mu   sync.Mutex
	got  map[openKey]map[uint64]int
	errs []string
	// moving counts answers "the conversation is moving" that reached a
	// client: the gateway retries those on the owner for up to 3 s, so
	// with stable owners none may reach one.
	moving int
}

func (o *opens) add(k openKey, info *protocol.ConvInfo, users [2]string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.got == nil {
		o.got = map[openKey]map[uint64]int{}
	}
	if o.got[k] == nil {
		o.got[k] = map[uint64]int{}
	}
	o.got[k][info.ConvID]++
	want := []string{users[0], users[1]}
	slices.Sort(want)
	if info.Kind != "direct" || info.E2E != k.e2e || !slices.Equal(info.Members, want) {
		o.errs = append(o.errs, fmt.Sprintf("pair %v answered %+v", users, info))
	}
}

func (o *opens) fail(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, fmt.Sprintf(format, args...))
}

// openRetrying sends open_direct until it is answered with a conversation:
// overloaded (the pair's partition moving, a process at capacity) and
// timeouts are retried, as a client does (opening is idempotent).
func openRetrying(c *Cluster, o *opens, g *Proc, user, device, peer string, e2e bool) (*protocol.ConvInfo, error) {
	var last string
	for range 40 {
		rc, err := dialRaw(c, g, user, device)
		if err != nil {
			last = err.Error()
			time.Sleep(250 * time.Millisecond)
			continue
		}
		r, err := rc.call(protocol.Frame{Type: protocol.TypeOpenDirect, Peer: peer, E2E: e2e}, 20*time.Second)
		rc.close()
		switch {
		case err != nil:
			last = err.Error()
		case r.Type == protocol.TypeConv && r.Conv != nil:
			return r.Conv, nil
		case r.Type == protocol.TypeError && (r.Code == protocol.CodeOverloaded || r.Code == protocol.CodeTimeout || r.Code == protocol.CodeStoreUnavailable):
			last = frameString(r)
			if r.Error == chat.MovingMsg {
				o.mu.Lock()
				o.moving++
				o.mu.Unlock()
			}
			time.Sleep(time.Duration(max(r.RetryAfter, 100)) * time.Millisecond)
			continue
		default:
			return nil, fmt.Errorf("open_direct %s-%s: %s", user, peer, frameString(r))
		}
		time.Sleep(250 * time.Millisecond)
	}
	return nil, fmt.Errorf("open_direct %s-%s never answered: %s", user, peer, last)
}

// apiDirect opens a direct conversation through the server API, retrying
// as openRetrying does.
func apiDirect(addr, key, a, b string, e2e bool) (*protocol.ConvInfo, error) {
	body, _ := json.Marshal(map[string]any{"users": []string{a, b}, "e2e": e2e})
	var last string
	for range 40 {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/admin/conversations/direct", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			last = err.Error()
			time.Sleep(250 * time.Millisecond)
			continue
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			var ans adminConvAns
			if err := json.Unmarshal(data, &ans); err != nil {
				return nil, fmt.Errorf("API direct %s-%s: %v (%s)", a, b, err, data)
			}
			return &ans.Conv, nil
		}
		last = fmt.Sprintf("%d %s", resp.StatusCode, data)
		if resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			return nil, fmt.Errorf("API direct %s-%s: %s", a, b, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil, fmt.Errorf("API direct %s-%s never answered: %s", a, b, last)
}

// TestOpenDirectOnePerPair: open_direct goes to the owner of the pair's
// partition (store.DirectKey), which decides the pair's conversation with
// plain writes fenced by its epoch (no transaction). Many devices of both
// users on two gateways, and the server API on one chat process, opening
// the same pairs at once (both orders, plain and end-to-end) get one
// conversation per pair and kind, with two chat processes owning the
// partitions; after a kill -9 of one pair's owner the reopens (and a new
// pair's opens, racing) still agree, and nobody's conversation list holds
// a conversation the opens did not answer.
func TestOpenDirectOnePerPair(t *testing.T) {
	c := Start(t, Options{})
	keyb := make([]byte, 32)
	_, _ = rand.Read(keyb)
	key := hex.EncodeToString(keyb)
	api := freeAddr(t)
	c1 := c.startWith("c1-"+c.keyspace, "chat", "--admin.listen", api, "--admin.key", key)
	c2 := c.startWith("c2-"+c.keyspace, "chat")
	c.Chats = append(c.Chats, c1, c2)
	g1 := c.startWith("g1-"+c.keyspace, "gateway")
	g2 := c.startWith("g2-"+c.keyspace, "gateway")
	c.Gateways = append(c.Gateways, g1, g2)
	time.Sleep(3 * time.Second) // both chat processes hold partitions

	const pairs, devices = 8, 3
	users := func(p int) [2]string { return [2]string{fmt.Sprintf("u%d", 2*p), fmt.Sprintf("u%d", 2*p+1)} }
	owners := map[string]bool{}
	for p := range pairs {
		u := users(p)
		node, _ := c.owner(store.DirectKey(u[0], u[1], false))
		owners[node] = true
	}
	t.Logf("the pairs' partitions are owned by %v", owners)

	var got opens
	var wg sync.WaitGroup
	start := make(chan struct{})
	// open runs one open_direct (or API call) for pair p once start closes.
	open := func(p int, side int, g *Proc, device string, e2e, viaAPI bool) {
		u := users(p)
		wg.Go(func() {
			<-start
			var info *protocol.ConvInfo
			var err error
			if viaAPI {
				info, err = apiDirect(api, key, u[side], u[1-side], e2e)
			} else {
				info, err = openRetrying(c, &got, g, u[side], device, u[1-side], e2e)
			}
			if err != nil {
				got.fail("%v", err)
				return
			}
			got.add(openKey{p, e2e}, info, u)
		})
	}
	for p := range pairs {
		for side := range 2 {
			for d := range devices {
				g := []*Proc{g1, g2}[(side+d)%2]
				open(p, side, g, fmt.Sprint("d", d), d == devices-1, false)
				open(p, side, g, fmt.Sprint("x", d), false, false)
			}
			open(p, side, nil, "", side == 1, true)
		}
	}
	close(start)
	wg.Wait()
	check := func(phase string, want int) map[openKey]uint64 {
		t.Helper()
		for _, e := range got.errs {
			t.Error(e)
		}
		ids := map[openKey]uint64{}
		seen := map[uint64]openKey{}
		for k, set := range got.got {
			if len(set) != 1 {
				t.Errorf("%s: pair %v (e2e %v) answered %d conversations: %v", phase, users(k.pair), k.e2e, len(set), set)
			}
			for id := range set {
				ids[k] = id
				if other, dup := seen[id]; dup {
					t.Errorf("%s: conversation %d answered for %v and %v", phase, id, k, other)
				}
				seen[id] = k
			}
		}
		if len(ids) != want {
			t.Errorf("%s: %d pair kinds answered, want %d", phase, len(ids), want)
		}
		return ids
	}
	ids := check("concurrent opens", 2*pairs)
	if got.moving != 0 {
		t.Errorf("%d opens were answered \"moving\" with stable owners: open_direct is not routed to the pair's owner", got.moving)
	}
	if t.Failed() {
		t.FailNow()
	}

	// kill -9 of pair 0's owner; its reopens (both kinds) and a new pair
	// u0-u2, racing on both gateways, while the partition moves.
	u := users(0)
	victim, _ := c.owner(store.DirectKey(u[0], u[1], false))
	t.Logf("killing %s, owner of %v", victim, u)
	c.Kill9(c.chat(victim))
	got = opens{}
	start = make(chan struct{})
	const newPair = pairs // users(newPair) is not u0-u2; map it by hand below
	for side := range 2 {
		for d := range devices {
			g := []*Proc{g1, g2}[(side+d)%2]
			open(0, side, g, fmt.Sprint("k", d), false, false)
			open(0, side, g, fmt.Sprint("e", d), true, false)
			// u0-u2, keyed as pair newPair.
			x, y := "u0", "u2"
			if side == 1 {
				x, y = y, x
			}
			wg.Go(func() {
				<-start
				info, err := openRetrying(c, &got, g, x, fmt.Sprint("n", d), y, false)
				if err != nil {
					got.fail("%v", err)
					return
				}
				got.add(openKey{newPair, false}, info, [2]string{"u0", "u2"})
			})
		}
	}
	close(start)
	wg.Wait()
	after := check("after the kill", 3)
	for _, k := range []openKey{{0, false}, {0, true}} {
		if after[k] != ids[k] {
			t.Errorf("pair %v (e2e %v) reopened as %d after the kill, was %d", u, k.e2e, after[k], ids[k])
		}
	}

	// Nobody's conversations hold anything the opens did not answer.
	want := map[string][]uint64{}
	for k, id := range ids {
		for _, who := range users(k.pair) {
			want[who] = append(want[who], id)
		}
	}
	for _, who := range []string{"u0", "u2"} {
		want[who] = append(want[who], after[openKey{newPair, false}])
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for who, ids := range want {
		slices.Sort(ids)
		var list []uint64
		for ctx.Err() == nil {
			rc, err := dialRaw(c, g1, who, "list")
			if err != nil {
				time.Sleep(250 * time.Millisecond)
				continue
			}
			r, err := rc.call(protocol.Frame{Type: protocol.TypeConvList}, 20*time.Second)
			rc.close()
			if err != nil || r.Type != protocol.TypeConvList {
				time.Sleep(250 * time.Millisecond)
				continue
			}
			list = list[:0]
			for _, s := range r.List {
				list = append(list, s.ConvID)
			}
			break
		}
		slices.Sort(list)
		if !slices.Equal(list, ids) {
			t.Errorf("%s's conversations %v, want %v", who, list, ids)
		}
	}
}
