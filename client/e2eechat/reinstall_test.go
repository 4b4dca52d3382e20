package e2eechat

import (
	"testing"

	"github.com/parley-im/parley/internal/servertest"
)

// A group member who reinstalls (same user and device id, a fresh key store
// and so a new identity) gets the other members' sender keys again: the
// record of who has a sender key names the identity it was sealed to, not
// only the device. Both orders: the new install reads before it speaks,
// and speaks before it reads.
func TestE2EGroupReinstalledMember(t *testing.T) {
	srv := servertest.Start(t)
	ctx := ctxT(t)
	alice := startDev(t, srv, "alice", "phone", 5)
	bob := startDev(t, srv, "bob", "phone", 5)
	carol := startDev(t, srv, "carol", "phone", 5)
	g, err := alice.c.CreateGroupE2E(ctx, "g", []string{"bob", "carol"})
	if err != nil {
		t.Fatal(err)
	}
	members := []string{"alice", "bob", "carol"}
	send := func(d *dev, text string) uint64 {
		t.Helper()
		ack, err := d.m.SendGroup(ctx, g.ConvID, members, text)
		if err != nil {
			t.Fatalf("send %q: %v", text, err)
		}
		return ack.Seq
	}
	// Each client opens each message once, as one fed by pushes does (read
	// would act on the system events again at every call).
	opened := map[*dev]map[uint64]string{}
	read := func(d *dev) map[uint64]string {
		t.Helper()
		if opened[d] == nil {
			opened[d] = map[uint64]string{}
		}
		for _, msg := range d.history(t, g.ConvID) {
			if _, done := opened[d][msg.Seq]; done {
				continue
			}
			o, err := d.m.Open(msg)
			switch {
			case err != nil:
				opened[d][msg.Seq] = "ERR:" + err.Error()
			case o.Control || o.System != nil:
				opened[d][msg.Seq] = ""
			default:
				opened[d][msg.Seq] = o.Text
			}
		}
		return opened[d]
	}
	m1, c1 := send(alice, "m1"), send(carol, "c1")
	got := read(bob)
	wantText(t, "bob", got, m1, "m1")
	wantText(t, "bob", got, c1, "c1")

	// Bob reinstalls and only listens at first.
	bob2 := startDev(t, srv, "bob", "phone", 5)
	read(alice)
	read(carol)
	m2, c2 := send(alice, "m2 after bob reinstalled"), send(carol, "c2 after bob reinstalled")
	got = read(bob2)
	wantText(t, "bob's new install", got, m2, "m2 after bob reinstalled")
	wantText(t, "bob's new install", got, c2, "c2 after bob reinstalled")
	b2 := send(bob2, "b2 from the new install")
	wantText(t, "alice", read(alice), b2, "b2 from the new install")
	wantText(t, "carol", read(carol), b2, "b2 from the new install")

	// Bob reinstalls again and speaks first.
	bob3 := startDev(t, srv, "bob", "phone", 5)
	b3 := send(bob3, "b3 from the third install")
	wantText(t, "alice", read(alice), b3, "b3 from the third install")
	wantText(t, "carol", read(carol), b3, "b3 from the third install")
	m3 := send(alice, "m3 to the third install")
	wantText(t, "bob's third install", read(bob3), m3, "m3 to the third install")
	// What the second install had sent stays readable by the others.
	wantText(t, "alice", read(alice), b2, "b2 from the new install")
}
