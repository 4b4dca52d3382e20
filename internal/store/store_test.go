package store

import (
	"testing"
	"time"
)

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

// TestDNDOn: until, a daily window within a day and across midnight, in
// the user's UTC offset.
func TestDNDOn(t *testing.T) {
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	night := DND{Daily: true, Start: 22 * 60, End: 7 * 60, Offset: 120} // 22:00-07:00 at UTC+2
	lunch := DND{Daily: true, Start: 12 * 60, End: 13 * 60, Offset: -300}
	for _, c := range []struct {
		name string
		d    DND
		now  string
		want bool
	}{
		{"off", DND{}, "2026-01-01T12:00:00Z", false},
		{"until ahead", DND{Until: at("2026-01-01T13:00:00Z").UnixMilli()}, "2026-01-01T12:00:00Z", true},
		{"until passed", DND{Until: at("2026-01-01T11:00:00Z").UnixMilli()}, "2026-01-01T12:00:00Z", false},
		{"night, 23:30 local", night, "2026-01-01T21:30:00Z", true},
		{"night, 06:59 local", night, "2026-01-01T04:59:00Z", true},
		{"night, 07:00 local", night, "2026-01-01T05:00:00Z", false},
		{"night, 21:59 local", night, "2026-01-01T19:59:00Z", false},
		{"lunch, 12:30 local", lunch, "2026-01-01T17:30:00Z", true},
		{"lunch, 13:00 local", lunch, "2026-01-01T18:00:00Z", false},
		{"lunch, 12:30 UTC", lunch, "2026-01-01T12:30:00Z", false},
		{"until passed, window on", DND{Until: 1, Daily: true, Start: 0, End: 60}, "2026-01-01T00:30:00Z", true},
	} {
		if got := c.d.On(at(c.now)); got != c.want {
			t.Errorf("%s: On(%s) = %v, want %v", c.name, c.now, got, c.want)
		}
	}
}
