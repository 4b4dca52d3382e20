package pebble

import (
	"context"
	"encoding/json"
	"fmt"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// Push registrations (store.Push):
//
//	J      J | user 0 device 0 provider 0 token   the registration (JSON)   push_regs
//	X      X | provider 0 token                   user 0 device (JSON)      push_tokens
//
// Tokens are printable ASCII (store.ValidPushReg), so 0 separates. Every
// change runs under pushMu and commits both keys in one synced batch.

const (
	tagPushReg   = 'J'
	tagPushToken = 'X'
)

func pushDevicePrefix(user, device string) []byte {
	k := append(tagged(tagPushReg, len(user)+len(device)+2), user...)
	k = append(k, 0)
	k = append(k, device...)
	return append(k, 0)
}

func pushUserPrefix(user string) []byte {
	k := append(tagged(tagPushReg, len(user)+1), user...)
	return append(k, 0)
}

func pushRegKey(user, device, provider, token string) []byte {
	k := append(pushDevicePrefix(user, device), provider...)
	k = append(k, 0)
	return append(k, token...)
}

func pushTokenKey(provider, token string) []byte {
	k := append(tagged(tagPushToken, len(provider)+len(token)+2), provider...)
	k = append(k, 0)
	return append(k, token...)
}

// pushOwner is a push_tokens value.
type pushOwner struct {
	User      string `json:"u"`
	Device    string `json:"d"`
	UpdatedAt int64  `json:"t"`
}

func (s *Store) pushOwner(provider, token string) (pushOwner, bool, error) {
	raw, found, err := s.get(pushTokenKey(provider, token))
	if err != nil || !found {
		return pushOwner{}, false, err
	}
	var o pushOwner
	if err := json.Unmarshal(raw, &o); err != nil {
		return pushOwner{}, false, err
	}
	return o, true, nil
}

func (s *Store) pushScan(prefix []byte) ([]store.PushReg, error) {
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	var out []store.PushReg
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		var r store.PushReg
		if err := json.Unmarshal(v, &r); err != nil {
			_ = it.Close()
			return nil, err
		}
		out = append(out, r)
	}
	return out, it.Close()
}

func (s *Store) PushRegister(ctx context.Context, r store.PushReg, max int) (*store.PushReg, error) {
	const op = "push register"
	s.pushMu.Lock()
	defer s.pushMu.Unlock()
	owner, found, err := s.pushOwner(r.Provider, r.Token)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	var moved *store.PushReg
	if found && (owner.User != r.UserID || owner.Device != r.DeviceID) {
		raw, ok, err := s.get(pushRegKey(owner.User, owner.Device, r.Provider, r.Token))
		if err != nil {
			return nil, fmt.Errorf("pebble: %s: %w", op, err)
		}
		m := store.PushReg{UserID: owner.User, DeviceID: owner.Device, Provider: r.Provider, Token: r.Token}
		if ok {
			_ = json.Unmarshal(raw, &m)
		}
		moved = &m
	}
	if !found || moved != nil {
		regs, err := s.pushScan(pushDevicePrefix(r.UserID, r.DeviceID))
		if err != nil {
			return nil, fmt.Errorf("pebble: %s: %w", op, err)
		}
		if len(regs) >= max {
			return nil, fmt.Errorf("pebble: %s: the device holds %d: %w", op, len(regs), store.ErrTooMany)
		}
	}
	val, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	own, _ := json.Marshal(pushOwner{User: r.UserID, Device: r.DeviceID, UpdatedAt: r.UpdatedAt})
	b := s.db.NewBatch()
	defer b.Close()
	if moved != nil {
		_ = b.Delete(pushRegKey(moved.UserID, moved.DeviceID, r.Provider, r.Token), nil)
	}
	_ = b.Set(pushRegKey(r.UserID, r.DeviceID, r.Provider, r.Token), val, nil)
	_ = b.Set(pushTokenKey(r.Provider, r.Token), own, nil)
	if err := b.Commit(syncWrite); err != nil {
		s.fail(err)
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return moved, nil
}

func (s *Store) PushRemove(ctx context.Context, user, device, provider, token string) error {
	const op = "push remove"
	s.pushMu.Lock()
	defer s.pushMu.Unlock()
	if err := s.pushRemove(user, device, provider, token); err != nil {
		return fmt.Errorf("pebble: %s: %w", op, err)
	}
	return nil
}

// pushRemove removes the device's registration of (provider, token), or
// every one of the device's (provider ""), under pushMu.
func (s *Store) pushRemove(user, device, provider, token string) error {
	var regs []store.PushReg
	if provider == "" {
		var err error
		if regs, err = s.pushScan(pushDevicePrefix(user, device)); err != nil {
			return err
		}
	} else {
		regs = []store.PushReg{{UserID: user, DeviceID: device, Provider: provider, Token: token}}
	}
	if len(regs) == 0 {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, r := range regs {
		_ = b.Delete(pushRegKey(user, device, r.Provider, r.Token), nil)
		o, found, err := s.pushOwner(r.Provider, r.Token)
		if err != nil {
			return err
		}
		if found && o.User == user && o.Device == device {
			_ = b.Delete(pushTokenKey(r.Provider, r.Token), nil)
		}
	}
	if err := b.Commit(syncWrite); err != nil {
		s.fail(err)
		return err
	}
	return nil
}

func (s *Store) PushRegs(ctx context.Context, user string) ([]store.PushReg, error) {
	regs, err := s.pushScan(pushUserPrefix(user))
	if err != nil {
		return nil, fmt.Errorf("pebble: push regs: %w", err)
	}
	return regs, nil
}

func (s *Store) PushDrop(ctx context.Context, provider, token string, before int64) error {
	const op = "push drop"
	s.pushMu.Lock()
	defer s.pushMu.Unlock()
	o, found, err := s.pushOwner(provider, token)
	if err != nil {
		return fmt.Errorf("pebble: %s: %w", op, err)
	}
	if !found || o.UpdatedAt > before {
		return nil
	}
	if err := s.pushRemove(o.User, o.Device, provider, token); err != nil {
		return fmt.Errorf("pebble: %s: %w", op, err)
	}
	return nil
}
