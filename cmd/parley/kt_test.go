package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/parley-im/parley/internal/kt"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/internal/store/pebble"
	pkt "github.com/parley-im/parley/protocol/kt"
)

// buildKTLog appends changes directory changes to the key transparency log
// of a node's data directory (its store on fs), through the server's own
// log: users users, each change a new identity key on one of the user's
// two devices.
func buildKTLog(t testing.TB, fs vfs.FS, dataDir string, users, changes int) {
	t.Helper()
	ctx := context.Background()
	st, err := pebble.Open(ctx, pebble.Config{Dir: filepath.Join(dataDir, "store"), FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := kt.Open(ctx, "parley", kt.Deps{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	account := append([]byte{5}, bytes.Repeat([]byte{0xAC}, 32)...)
	key := func(i int) []byte {
		h := sha256.Sum256(binary.BigEndian.AppendUint64(nil, uint64(i)))
		return append([]byte{5}, h[:]...)
	}
	devs := make([][]store.DeviceKeys, users)
	for i := range changes {
		u := i % users
		d := store.DeviceKeys{DeviceID: fmt.Sprintf("d%d", (i/users)%2), IdentityKey: key(i), AccountKey: account,
			DeviceSig: bytes.Repeat([]byte{byte(i)}, 64), UpdatedAt: int64(i)}
		if len(devs[u]) < 2 && (len(devs[u]) == 0 || devs[u][0].DeviceID != d.DeviceID) {
			devs[u] = append(devs[u], d)
		} else {
			for j := range devs[u] {
				if devs[u][j].DeviceID == d.DeviceID {
					devs[u][j] = d
				}
			}
		}
		cur := append([]store.DeviceKeys(nil), devs[u]...)
		if _, err := l.Ensure(ctx, fmt.Sprintf("user%05d", u), cur, func(context.Context) ([]store.DeviceKeys, error) { return cur, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if l.Size() != uint64(changes) {
		t.Fatalf("log of %d leaves after %d changes", l.Size(), changes)
	}
}

func startOn(t testing.TB, fs vfs.FS, dataDir string) *servertest.Server {
	return servertest.Start(t, servertest.WithDataDir(dataDir), servertest.WithDeps(func(d *server.Deps) { d.StoreFS = fs }))
}

// TestKTAudit100k: `parley kt audit` verifies a log of 100,000 changes
// (10,000 under the race detector) over the public GETs, records the
// checkpoint in its state file, and audits again against it.
func TestKTAudit100k(t *testing.T) {
	changes, users := 100_000, 10_000
	if raceEnabled {
		changes, users = 10_000, 1_000
	}
	fs, dataDir := vfs.NewMem(), t.TempDir()
	begin := time.Now()
	buildKTLog(t, fs, dataDir, users, changes)
	t.Logf("built a log of %d changes in %v", changes, time.Since(begin).Round(time.Millisecond))
	srv := startOn(t, fs, dataDir)
	state := filepath.Join(t.TempDir(), "kt-state.json")
	var out bytes.Buffer
	if err := runKT(context.Background(), []string{"audit", "-server", srv.HTTPURL, "-state", state}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(strings.TrimSpace(out.String()))
	if !strings.Contains(out.String(), fmt.Sprintf("%d entries (%d users), size %d", changes, users, changes)) {
		t.Fatalf("audit said %q", out.String())
	}
	res, err := ktAudit(context.Background(), http.DefaultClient, srv.HTTPURL, state)
	if err != nil || res.Entries != uint64(changes) || !strings.Contains(res.Since, fmt.Sprint(changes)) {
		t.Fatalf("second audit: %+v, %v", res, err)
	}
	t.Logf("second audit, against the state: %v", res.Elapsed.Round(time.Millisecond))
}

// copyLog writes into a new data directory's store the keys of the log in
// from and its leaves as edit returns them (a server operator rewriting
// its log).
func copyLog(t *testing.T, fs vfs.FS, from, to string, edit func([][]byte) [][]byte) {
	t.Helper()
	ctx := context.Background()
	src, err := pebble.Open(ctx, pebble.Config{Dir: filepath.Join(from, "store"), FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := src.KTKeys(ctx, []byte("unused"))
	if err != nil {
		t.Fatal(err)
	}
	var leaves [][]byte
	for {
		page, err := src.KTLeaves(ctx, uint64(len(leaves)), store.MaxKTPage)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		leaves = append(leaves, page...)
	}
	_ = src.Close()
	dst, err := pebble.Open(ctx, pebble.Config{Dir: filepath.Join(to, "store"), FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := dst.KTKeys(ctx, keys); err != nil {
		t.Fatal(err)
	}
	for i, l := range edit(leaves) {
		if err := dst.KTAppend(ctx, uint64(i), l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKTAuditRefusesRewrittenLog: after an audit, a server that rolls its
// log back, or rewrites a past entry (signing new checkpoints with the same
// key), fails the next audit; a rewritten entry fails even a first audit
// when it breaks the label's hash chain.
func TestKTAuditRefusesRewrittenLog(t *testing.T) {
	fs := vfs.NewMem()
	honest := t.TempDir()
	buildKTLog(t, fs, honest, 100, 2000)
	state := filepath.Join(t.TempDir(), "kt-state.json")
	srv := startOn(t, fs, honest)
	if _, err := ktAudit(context.Background(), http.DefaultClient, srv.HTTPURL, state); err != nil {
		t.Fatal(err)
	}
	srv.Close()

	rolledBack := t.TempDir()
	copyLog(t, fs, honest, rolledBack, func(l [][]byte) [][]byte { return l[:1500] })
	srv = startOn(t, fs, rolledBack)
	if _, err := ktAudit(context.Background(), http.DefaultClient, srv.HTTPURL, state); !errors.Is(err, pkt.ErrRollback) {
		t.Fatalf("audit of a rolled-back log: %v, want ErrRollback", err)
	}
	srv.Close()

	// Leaf 700 (user 0's 8th entry) with another identity key: a ghost
	// device shown and then taken back.
	rewritten := t.TempDir()
	copyLog(t, fs, honest, rewritten, func(l [][]byte) [][]byte {
		e, err := pkt.UnmarshalEntry(l[700])
		if err != nil {
			t.Fatal(err)
		}
		e.Devices[0].IdentityKey = append([]byte{5}, bytes.Repeat([]byte{0x66}, 32)...)
		out := append([][]byte(nil), l...)
		out[700] = e.Marshal()
		return out
	})
	srv = startOn(t, fs, rewritten)
	if _, err := ktAudit(context.Background(), http.DefaultClient, srv.HTTPURL, state); !errors.Is(err, pkt.ErrAudit) && !errors.Is(err, pkt.ErrFork) {
		t.Fatalf("audit of a rewritten log against the state: %v, want ErrAudit or ErrFork", err)
	}
	if _, err := ktAudit(context.Background(), http.DefaultClient, srv.HTTPURL, ""); !errors.Is(err, pkt.ErrAudit) {
		t.Fatalf("first audit of a rewritten log: %v, want ErrAudit (the label's hash chain)", err)
	}
	// The same log rewritten at its last entry of a label only: a first
	// audit cannot tell, the state's checkpoint can.
	tail := t.TempDir()
	copyLog(t, fs, honest, tail, func(l [][]byte) [][]byte {
		e, _ := pkt.UnmarshalEntry(l[1999])
		e.Devices[0].IdentityKey = append([]byte{5}, bytes.Repeat([]byte{0x67}, 32)...)
		out := append([][]byte(nil), l...)
		out[1999] = e.Marshal()
		return out
	})
	srv.Close()
	srv = startOn(t, fs, tail)
	if _, err := ktAudit(context.Background(), http.DefaultClient, srv.HTTPURL, ""); err != nil {
		t.Fatalf("first audit of a log rewritten at a label's last entry: %v (it is a valid log)", err)
	}
	if _, err := ktAudit(context.Background(), http.DefaultClient, srv.HTTPURL, state); !errors.Is(err, pkt.ErrAudit) && !errors.Is(err, pkt.ErrFork) {
		t.Fatalf("audit against the state of a log rewritten at its tail: %v, want a refusal", err)
	}
}
