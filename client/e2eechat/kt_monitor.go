package e2eechat

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/e2ekeys"
	"github.com/parley-im/parley/protocol/kt"
)

// ktMonitor is MonitorKeys' position in the log, kept in the store.
type ktMonitor struct {
	Next  uint64 `json:"next"`  // the first leaf not read yet
	Range []byte `json:"range"` // kt.CompactRange of the leaves read
	// Version and Hash: the last entry under this user's label.
	Version uint64 `json:"version,omitempty"`
	Hash    []byte `json:"hash,omitempty"`
	// Before: no entry under this account's key was read yet. Entries
	// under the label until then are a replaced account's (a reinstall
	// without the old key starts over with ReplaceAccount), published
	// before this account existed: not this account's to judge.
	Before bool `json:"before,omitempty"`
}

// MonitorKeys reads the key transparency log from where it stopped last
// time to the current checkpoint, checks that the leaves rebuild the
// checkpoint's root, and looks at every entry under this user's own label
// from the first one under this account's key on (the entries before it
// are those of an account this one replaced): one whose account key is not
// this account's, or with a device whose certificate does not verify with
// it, is something this user's devices did not publish. Such entries are reported to OnKT and the error wraps
// ErrKTGhost and names them (each is reported once: the next call starts
// after it). A log that does not rebuild the checkpoint, or does not
// extend the head, is ErrKTFork; a malformed page ErrKTProof. Call it on
// start and from time to time: a server that adds a device for this user
// must log it, or the contacts it shows it to refuse it.
func (m *Messenger) MonitorKeys(ctx context.Context) error {
	m.kt.monMu.Lock()
	defer m.kt.monMu.Unlock()
	user := m.self.User
	account, ok, err := m.d.AccountKey()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("e2eechat: key transparency: this device has no account key to monitor with")
	}
	accountKey := account.Bytes()
	// This user's label, proven by the server's VRF.
	list, p, err := m.c.KeyDevicesKT(ctx, user)
	if err != nil {
		return err
	}
	devs := make([]ktDevice, len(list))
	for i, d := range list {
		devs[i] = ktDevice{id: d.DeviceID, identityKey: d.IdentityKey, accountKey: d.AccountKey, sig: d.DeviceSig}
	}
	label, err := m.ktVerify(ctx, user, p, devs)
	if err != nil {
		return err
	}
	m.kt.mu.Lock()
	keys := m.kt.keys
	m.kt.mu.Unlock()
	if keys == nil {
		return ErrKTUnavailable
	}

	st := ktMonitor{Before: true}
	if b, err := m.st.Load(ktMonitorKey); err != nil {
		return err
	} else if b != nil {
		st = ktMonitor{}
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("e2eechat: key transparency: monitor state: %w", err)
		}
	}
	rng := kt.NewCompactRange()
	if st.Range != nil {
		if rng, err = kt.UnmarshalCompactRange(st.Range); err != nil {
			return fmt.Errorf("e2eechat: key transparency: monitor state: %w", err)
		}
	}
	if rng.Size() != st.Next {
		return fmt.Errorf("e2eechat: key transparency: monitor state at %d with a range of %d", st.Next, rng.Size())
	}

	var ghosts []string
	var cur kt.Checkpoint
	var curText string
	for {
		page, err := m.c.KTLeaves(ctx, st.Next, 0)
		if err != nil {
			if client.CodeOf(err) == protocol.CodeInvalidArgument {
				return m.ktFail(user, fmt.Errorf("%w: %w: the server's log is smaller than the %d leaves already monitored: %v", ErrKTFork, kt.ErrRollback, st.Next, err))
			}
			return fmt.Errorf("e2eechat: key transparency: %w", err)
		}
		if cur, err = kt.OpenCheckpoint(keys.verifier, []byte(page.Checkpoint)); err != nil {
			return m.ktFail(user, ktProofErr("%v", err))
		}
		curText = page.Checkpoint
		if page.From != st.Next || st.Next+uint64(len(page.Entries)) > cur.Size {
			return m.ktFail(user, ktProofErr("a page of %d leaves from %d, for leaves from %d of %d", len(page.Entries), page.From, st.Next, cur.Size))
		}
		for _, b := range page.Entries {
			index := st.Next
			rng.Append(b)
			st.Next++
			e, err := kt.UnmarshalEntry(b)
			if err != nil {
				return m.ktFail(user, ktProofErr("leaf %d: %v", index, err))
			}
			if e.Label != label {
				continue
			}
			if e.Version != st.Version+1 || (st.Version > 0 && !bytes.Equal(e.Prev[:], st.Hash)) {
				return m.ktFail(user, ktProofErr("leaf %d: your entry at version %d does not follow version %d", index, e.Version, st.Version))
			}
			h := kt.EntryHash(b)
			st.Version, st.Hash = e.Version, h[:]
			if st.Before && !bytes.Equal(e.Account, accountKey) {
				continue
			}
			st.Before = false
			ghosts = append(ghosts, ghostFindings(index, e, user, accountKey)...)
		}
		if st.Next == cur.Size {
			break
		}
		if len(page.Entries) == 0 {
			return m.ktFail(user, ktProofErr("no leaves from %d of a log of %d", st.Next, cur.Size))
		}
	}
	if rng.Root() != cur.Root {
		return m.ktFail(user, ktForkErr("the %d leaves served do not give the checkpoint's root", cur.Size))
	}
	m.kt.mu.Lock()
	err = m.ktAdvance(ctx, cur, curText)
	m.kt.mu.Unlock()
	if err != nil {
		return m.ktFail(user, err)
	}
	st.Range = rng.Marshal()
	b, _ := json.Marshal(st)
	if err := m.st.Save(ktMonitorKey, b); err != nil {
		return err
	}
	if len(ghosts) > 0 {
		err := fmt.Errorf("%w: %s", ErrKTGhost, strings.Join(ghosts, "; "))
		m.ktReport(user, err)
		return err
	}
	return nil
}

// ghostFindings lists what in entry e (leaf index, under this user's
// label) this account did not publish.
func ghostFindings(index uint64, e kt.Entry, user string, account []byte) []string {
	var out []string
	if len(e.Account) > 0 && !bytes.Equal(e.Account, account) {
		out = append(out, fmt.Sprintf("leaf %d (version %d): an account key that is not yours", index, e.Version))
	}
	for _, d := range e.Devices {
		if !e2ekeys.VerifyDeviceCert(account, user, d.ID, d.IdentityKey, d.Sig) {
			out = append(out, fmt.Sprintf("leaf %d (version %d): device %q not certified by your account key", index, e.Version, d.ID))
		}
	}
	return out
}
