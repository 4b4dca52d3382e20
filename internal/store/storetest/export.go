package storetest

import (
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// testExport checks store.Exporter, where the engine has it, against what
// the Store methods read: every conversation, every membership (former
// ones too), every position, every device with its one-time prekeys,
// every attachment record, the KT keys, every user's mutes and
// do-not-disturb.
func testExport(t *testing.T, e *env) {
	exp, ok := store.ExporterOf(e.s)
	if !ok {
		t.Skip("the engine has no Exporter")
	}
	ctx := context.Background()
	if k, err := exp.ExportKTKeys(ctx); err != nil || k != nil {
		t.Fatalf("ExportKTKeys of an empty store = %q, %v", k, err)
	}
	var ids []uint64
	for i := uint64(1); i <= 7; i++ {
		id := i * 1000
		e.group(t, id, "alice", "bob")
		ids = append(ids, id)
	}
	direct, err := e.s.Direct(ctx, "alice", "erin", 9999, baseTime)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, direct.ID)
	e.send(t, 1000, "alice", 3)
	if _, err := e.s.AddMembers(ctx, 1000, []string{"carol"}, store.RoleAdmin); err != nil {
		t.Fatal(err)
	}
	e.send(t, 1000, "bob", 2)
	if _, err := e.s.RemoveMembers(ctx, 1000, []string{"bob"}); err != nil {
		t.Fatal(err)
	}

	// Conversations, by id, in pages.
	var got []uint64
	for after := uint64(0); ; {
		cs, err := exp.ExportConversations(ctx, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 0 {
			break
		}
		if len(cs) > 3 {
			t.Fatalf("a page of %d, limit 3", len(cs))
		}
		for _, c := range cs {
			want, err := e.s.Conversation(ctx, c.ID)
			if err != nil || !reflect.DeepEqual(c, want) {
				t.Errorf("exported %+v, Conversation %+v, %v", c, want, err)
			}
			got = append(got, c.ID)
		}
		after = cs[len(cs)-1].ID
	}
	slices.Sort(ids)
	if !slices.Equal(got, ids) {
		t.Errorf("exported conversations %v, want %v", got, ids)
	}

	// Memberships, former ones included.
	ms, err := exp.ExportMembers(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, m := range ms {
		want, err := e.s.Member(ctx, 1000, m.UserID)
		if err != nil || m != want {
			t.Errorf("exported %+v, Member %+v, %v", m, want, err)
		}
		users = append(users, m.UserID)
	}
	if !slices.Equal(users, []string{"alice", "bob", "carol"}) {
		t.Errorf("exported members %v", users)
	}
	if i := slices.IndexFunc(ms, func(m store.Member) bool { return m.UserID == "bob" }); i < 0 || ms[i].LeaveSeq != 5 {
		t.Errorf("bob's exported membership %+v, want leave seq 5", ms)
	}

	// Positions.
	want := []store.Position{
		{User: "alice", ConvID: 1000, Seq: 4},
		{User: "alice", Device: "phone", ConvID: 1000, Seq: 5},
		{User: "bob", ConvID: 2000, Seq: 1},
		{User: "alice", ConvID: 1000, Seq: 3, Delivered: true},
		{User: "carol", ConvID: 1000, Seq: 5, Delivered: true},
	}
	for _, p := range want {
		if p.Delivered {
			_, err = e.s.SetDelivered(ctx, p.User, p.ConvID, p.Seq)
		} else {
			_, err = e.s.SetRead(ctx, p.User, p.Device, p.ConvID, p.Seq)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var ps []store.Position
	if err := exp.ExportPositions(ctx, func(p store.Position) error { ps = append(ps, p); return nil }); err != nil {
		t.Fatal(err)
	}
	less := func(a, b store.Position) int {
		return cmpAll(boolInt(a.Delivered)-boolInt(b.Delivered), cmpStr(a.User, b.User), int(a.ConvID)-int(b.ConvID), cmpStr(a.Device, b.Device))
	}
	slices.SortFunc(ps, less)
	slices.SortFunc(want, less)
	if !reflect.DeepEqual(ps, want) {
		t.Errorf("exported positions %+v, want %+v", ps, want)
	}

	// Devices with their prekeys; one taken by a bundle is gone.
	up := store.KeyUpload{
		RegistrationID: 7, IdentityKey: []byte("identity"), AccountKey: []byte("account"), DeviceSig: []byte("sig"),
		SignedPreKey:  &store.PreKey{ID: 1, Key: []byte("spk"), Sig: []byte("spk-sig")},
		LastResortKEM: &store.PreKey{ID: 2, Key: []byte("kem-lr"), Sig: []byte("kem-lr-sig")},
		PreKeys:       []store.PreKey{{ID: 10, Key: []byte("otk10")}, {ID: 11, Key: []byte("otk11")}},
		KEMPreKeys:    []store.PreKey{{ID: 20, Key: []byte("kem20"), Sig: []byte("kem20-sig")}},
		Now:           baseTime,
	}
	for _, d := range []string{"phone", "laptop"} {
		if _, err := e.s.UploadKeys(ctx, "alice", d, up); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.s.TakeBundle(ctx, "alice", "laptop"); err != nil {
		t.Fatal(err)
	}
	type dev struct {
		d        store.DeviceKeys
		pre, kem []store.PreKey
	}
	var devs []dev
	if err := exp.ExportKeys(ctx, func(d store.DeviceKeys, pre, kem []store.PreKey) error {
		devs = append(devs, dev{d, pre, kem})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stored, err := e.s.KeyDevices(ctx, "alice")
	if err != nil || len(devs) != 2 || len(stored) != 2 {
		t.Fatalf("exported %d devices, KeyDevices %d, %v", len(devs), len(stored), err)
	}
	for _, d := range devs {
		i := slices.IndexFunc(stored, func(s store.DeviceKeys) bool { return s.DeviceID == d.d.DeviceID })
		if i < 0 || !reflect.DeepEqual(d.d, stored[i]) {
			t.Errorf("exported device %+v, KeyDevices %+v", d.d, stored)
		}
		pre, kem, _ := e.s.PreKeyCounts(ctx, "alice", d.d.DeviceID)
		if len(d.pre) != pre || len(d.kem) != kem {
			t.Errorf("device %s: exported %d and %d prekeys, counts %d and %d", d.d.DeviceID, len(d.pre), len(d.kem), pre, kem)
		}
		if d.d.DeviceID == "phone" && (!samePreKeys(d.pre, up.PreKeys) || !samePreKeys(d.kem, up.KEMPreKeys)) {
			t.Errorf("phone's exported prekeys %+v %+v, want %+v %+v", d.pre, d.kem, up.PreKeys, up.KEMPreKeys)
		}
	}

	// Attachment records, by id, in pages.
	for id := uint64(1); id <= 3; id++ {
		a := store.Attachment{ID: id, Owner: "alice", Device: "phone", ConvID: 1000, Size: 10, State: store.AttachUploading, CreatedAt: baseTime, ExpiresAt: baseTime + 1000, PartSize: 10}
		if err := e.s.CreateAttachment(ctx, a, 1<<30, 10); err != nil {
			t.Fatal(err)
		}
	}
	var as []uint64
	for after := uint64(0); ; {
		page, err := exp.ExportAttachments(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, a := range page {
			want, err := e.s.Attachment(ctx, a.ID)
			if err != nil || !reflect.DeepEqual(a, want) {
				t.Errorf("exported %+v, Attachment %+v, %v", a, want, err)
			}
			as = append(as, a.ID)
		}
		after = page[len(page)-1].ID
	}
	if !slices.Equal(as, []uint64{1, 2, 3}) {
		t.Errorf("exported attachments %v", as)
	}

	// Push registrations of every device.
	var regs []store.PushReg
	for i, d := range []string{"phone", "laptop"} {
		r := store.PushReg{UserID: "alice", DeviceID: d, Provider: "fcm", Token: "token-" + d, UpdatedAt: baseTime + int64(i)}
		if _, err := e.s.PushRegister(ctx, r, 10); err != nil {
			t.Fatal(err)
		}
		regs = append(regs, r)
	}
	gotRegs, err := exp.ExportPushRegs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantRegs, err2 := e.s.PushRegs(ctx, "alice")
	if err != nil || err2 != nil || len(gotRegs) != 2 || !reflect.DeepEqual(gotRegs, wantRegs) {
		t.Errorf("exported push registrations %+v, PushRegs %+v (%v, %v), registered %+v", gotRegs, wantRegs, err, err2, regs)
	}

	// Notification preferences: mutes and do-not-disturb, by user.
	if err := e.s.SetConvMute(ctx, "bob", 7, store.MuteForever); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetConvMute(ctx, "bob", 1<<40|3, baseTime); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetConvMute(ctx, "carol", 9, baseTime+1); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetConvMute(ctx, "carol", 9, 0); err != nil { // unmuted: gone
		t.Fatal(err)
	}
	dnd := store.DND{Daily: true, Start: 22 * 60, End: 7 * 60, Offset: -300}
	if err := e.s.SetDND(ctx, "dave", dnd); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetDND(ctx, "bob", store.DND{Until: baseTime + 5}); err != nil {
		t.Fatal(err)
	}
	type prefs struct {
		user  string
		mutes map[uint64]int64
		dnd   store.DND
	}
	var gotPrefs []prefs
	err = exp.ExportNotify(ctx, func(user string, mutes map[uint64]int64, d store.DND) error {
		gotPrefs = append(gotPrefs, prefs{user, mutes, d})
		return nil
	})
	wantPrefs := []prefs{
		{"bob", map[uint64]int64{7: store.MuteForever, 1<<40 | 3: baseTime}, store.DND{Until: baseTime + 5}},
		{"dave", nil, dnd},
	}
	if err != nil || !reflect.DeepEqual(gotPrefs, wantPrefs) {
		t.Errorf("ExportNotify = %+v, %v; want %+v", gotPrefs, err, wantPrefs)
	}

	keys, err := e.s.KTKeys(ctx, []byte("kt-keys"))
	if err != nil {
		t.Fatal(err)
	}
	if k, err := exp.ExportKTKeys(ctx); err != nil || string(k) != string(keys) {
		t.Errorf("ExportKTKeys = %q, %v; want %q", k, err, keys)
	}
}

// samePreKeys compares prekeys, an empty signature as none.
func samePreKeys(a, b []store.PreKey) bool {
	return slices.EqualFunc(a, b, func(x, y store.PreKey) bool {
		return x.ID == y.ID && string(x.Key) == string(y.Key) && string(x.Sig) == string(y.Sig)
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpAll(cs ...int) int {
	for _, c := range cs {
		if c != 0 {
			return c
		}
	}
	return 0
}
