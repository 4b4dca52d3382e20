package cassandra

import (
	"context"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// Push registrations (store.Push) in two tables: push_regs, partition
// user_id, clustering (device_id, provider, push_token), so a user's devices
// are one read; and push_tokens, partition (provider, push_token), naming the
// device that holds the token. A change writes both in one logged batch
// (both or neither, eventually). Two devices registering one token at the
// same moment may both keep a push_regs row; push_tokens names one of
// them, and the pusher sends only to the registration push_tokens names.

const pushRegColumns = `user_id, device_id, provider, push_token, topic, sandbox, p256dh, auth, updated_at`

func scanPushRegs(it *gocql.Iter) ([]store.PushReg, error) {
	var out []store.PushReg
	var r store.PushReg
	for it.Scan(&r.UserID, &r.DeviceID, &r.Provider, &r.Token, &r.Topic, &r.Sandbox, &r.P256dh, &r.Auth, &r.UpdatedAt) {
		out = append(out, r)
		r = store.PushReg{}
	}
	return out, it.Close()
}

type pushOwner struct {
	user, device string
	updatedAt    int64
}

func (s *Store) pushOwner(ctx context.Context, provider, token string) (pushOwner, bool, error) {
	var o pushOwner
	err := s.q(ctx, `SELECT user_id, device_id, updated_at FROM push_tokens WHERE provider = ? AND push_token = ?`, provider, token).
		Scan(&o.user, &o.device, &o.updatedAt)
	if err == gocql.ErrNotFound {
		return o, false, nil
	}
	return o, err == nil, err
}

func (s *Store) logged(ctx context.Context) *gocql.Batch {
	return s.sess.Batch(gocql.LoggedBatch).WithContext(ctx).Consistency(s.cons)
}

func (s *Store) PushRegister(ctx context.Context, r store.PushReg, max int) (*store.PushReg, error) {
	const op = "push register"
	owner, found, err := s.pushOwner(ctx, r.Provider, r.Token)
	if err != nil {
		return nil, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	var moved *store.PushReg
	if found && (owner.user != r.UserID || owner.device != r.DeviceID) {
		m := store.PushReg{UserID: owner.user, DeviceID: owner.device, Provider: r.Provider, Token: r.Token}
		regs, err := scanPushRegs(s.q(ctx, `SELECT `+pushRegColumns+` FROM push_regs WHERE user_id = ? AND device_id = ? AND provider = ? AND push_token = ?`,
			owner.user, owner.device, r.Provider, r.Token).Iter())
		if err != nil {
			return nil, fmt.Errorf("cassandra: %s: %w", op, err)
		}
		if len(regs) == 1 {
			m = regs[0]
		}
		moved = &m
	}
	if !found || moved != nil {
		var n int
		if err := s.q(ctx, `SELECT COUNT(*) FROM push_regs WHERE user_id = ? AND device_id = ?`, r.UserID, r.DeviceID).Scan(&n); err != nil {
			return nil, fmt.Errorf("cassandra: %s: %w", op, err)
		}
		if n >= max {
			return nil, fmt.Errorf("cassandra: %s: the device holds %d: %w", op, n, store.ErrTooMany)
		}
	}
	b := s.logged(ctx)
	if moved != nil {
		b.Query(`DELETE FROM push_regs WHERE user_id = ? AND device_id = ? AND provider = ? AND push_token = ?`, moved.UserID, moved.DeviceID, r.Provider, r.Token)
	}
	b.Query(`INSERT INTO push_regs (`+pushRegColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.UserID, r.DeviceID, r.Provider, r.Token, r.Topic, r.Sandbox, r.P256dh, r.Auth, r.UpdatedAt)
	b.Query(`INSERT INTO push_tokens (provider, push_token, user_id, device_id, updated_at) VALUES (?, ?, ?, ?, ?)`,
		r.Provider, r.Token, r.UserID, r.DeviceID, r.UpdatedAt)
	if err := b.Exec(); err != nil {
		return nil, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return moved, nil
}

func (s *Store) PushRemove(ctx context.Context, user, device, provider, token string) error {
	if err := s.pushRemove(ctx, user, device, provider, token); err != nil {
		return fmt.Errorf("cassandra: push remove: %w", err)
	}
	return nil
}

func (s *Store) pushRemove(ctx context.Context, user, device, provider, token string) error {
	var regs []store.PushReg
	if provider == "" {
		var err error
		regs, err = scanPushRegs(s.q(ctx, `SELECT `+pushRegColumns+` FROM push_regs WHERE user_id = ? AND device_id = ?`, user, device).Iter())
		if err != nil {
			return err
		}
	} else {
		regs = []store.PushReg{{UserID: user, DeviceID: device, Provider: provider, Token: token}}
	}
	if len(regs) == 0 {
		return nil
	}
	b := s.logged(ctx)
	for _, r := range regs {
		b.Query(`DELETE FROM push_regs WHERE user_id = ? AND device_id = ? AND provider = ? AND push_token = ?`, user, device, r.Provider, r.Token)
		o, found, err := s.pushOwner(ctx, r.Provider, r.Token)
		if err != nil {
			return err
		}
		if found && o.user == user && o.device == device {
			b.Query(`DELETE FROM push_tokens WHERE provider = ? AND push_token = ?`, r.Provider, r.Token)
		}
	}
	return b.Exec()
}

func (s *Store) PushRegs(ctx context.Context, user string) ([]store.PushReg, error) {
	regs, err := scanPushRegs(s.q(ctx, `SELECT `+pushRegColumns+` FROM push_regs WHERE user_id = ?`, user).Iter())
	if err != nil {
		return nil, fmt.Errorf("cassandra: push regs: %w", err)
	}
	return regs, nil
}

func (s *Store) PushDrop(ctx context.Context, provider, token string, before int64) error {
	const op = "push drop"
	o, found, err := s.pushOwner(ctx, provider, token)
	if err != nil {
		return fmt.Errorf("cassandra: %s: %w", op, err)
	}
	if !found || o.updatedAt > before {
		return nil
	}
	if err := s.pushRemove(ctx, o.user, o.device, provider, token); err != nil {
		return fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return nil
}
