package relay

import (
	"encoding/json"
	"fmt"
	"testing"
)

// FuzzDigest: a digest kept up to date one change at a time equals the
// digest of the final set computed from scratch, whatever the changes
// (so a receiver that applied the same events as the node agrees with
// the node's digest), and a list split into chunks holds every user once,
// each chunk's encoding under the limit.
func FuzzDigest(f *testing.F) {
	f.Add([]byte{1, 2, 3, 0x81, 2, 2}, 300)
	f.Add([]byte{0xff, 0xff, 0, 0, 7}, 250)
	f.Fuzz(func(t *testing.T, ops []byte, limit int) {
		limit = 250 + abs(limit)%4000
		m := map[string]int{}
		var d digest
		for i, op := range ops {
			u := fmt.Sprintf("user-%d", op&0x3f)
			n := m[u]
			if op&0x80 != 0 {
				n--
			} else {
				n += 1 + i%2
			}
			if n < 0 {
				continue
			}
			d.set(m, u, n)
		}
		var fresh digest
		scratch := map[string]int{}
		for u, n := range m {
			fresh.set(scratch, u, n)
		}
		if d != fresh || d.Users != len(m) {
			t.Fatalf("incremental digest %+v, from scratch %+v, %d users", d, fresh, len(m))
		}
		seen := map[string]int{}
		for _, c := range chunk(m, limit) {
			c.Node, c.Inst, c.Seq = "gateway-node-with-a-long-name", ^uint64(0), ^uint64(0)>>1
			data, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Users) > 1 && len(data) > limit {
				t.Fatalf("chunk of %d users is %d bytes, limit %d", len(c.Users), len(data), limit)
			}
			for u, n := range c.Users {
				if _, dup := seen[u]; dup {
					t.Fatalf("%s in two chunks", u)
				}
				seen[u] = n
			}
		}
		if len(seen) != len(m) {
			t.Fatalf("chunks hold %d users, want %d", len(seen), len(m))
		}
		for u, n := range m {
			if seen[u] != n {
				t.Fatalf("%s: %d devices in the chunks, want %d", u, seen[u], n)
			}
		}
	})
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
