package store

import "testing"

// TestDirectKey: the pair's routing key ignores the order, tells the
// end-to-end conversation and other pairs apart, and stays what it is
// (gateways and chat processes must agree on it: a change moves every
// pair to another partition's owner).
func TestDirectKey(t *testing.T) {
	if DirectKey("alice", "bob", false) != DirectKey("bob", "alice", false) || DirectKey("alice", "bob", true) != DirectKey("bob", "alice", true) {
		t.Fatal("DirectKey depends on the order of the pair")
	}
	seen := map[uint64]string{}
	for _, p := range [][3]string{{"alice", "bob", ""}, {"alice", "bob", "e2e"}, {"alic", "ebob", ""}, {"alice", "carol", ""}, {"a", "b", ""}, {"ab", "", ""}} {
		k := DirectKey(p[0], p[1], p[2] != "")
		if other, dup := seen[k]; dup {
			t.Errorf("DirectKey%v = DirectKey%v", p, other)
		}
		seen[k] = p[0] + "," + p[1] + "," + p[2]
	}
	if got, want := DirectKey("alice", "bob", false), uint64(0xccb524eae0e0ca24); got != want {
		t.Errorf("DirectKey(alice, bob) = %#x, want %#x (the routing key must not change between releases)", got, want)
	}
}
