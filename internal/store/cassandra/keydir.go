package cassandra

import (
	"context"
	"errors"
	"fmt"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/parley-im/parley/internal/store"
)

// The E2E key directory (store.KeyDirectory) in two tables: e2e_devices
// (partition user, one row per device) and e2e_prekeys (partition (user,
// device), clustering kind then key id). A one-time key is handed out by a
// lightweight transaction, DELETE ... IF EXISTS: of several fetchers (on any
// node) that read the same row, only the one whose delete applied gets it;
// the others move on to the next row.

const (
	kindPreKey int8 = 1
	kindKEM    int8 = 2
	// takeCandidates is how many rows a fetch reads per attempt.
	takeCandidates = 8
	takeAttempts   = 16
)

const selectDevice = `SELECT device_id, reg_id, identity_key, spk_id, spk, spk_sig, lr_id, lr_key, lr_sig, updated_at, account_key, device_sig FROM e2e_devices`

func scanDevice(user string, sc interface{ Scan(...any) bool }) (store.DeviceKeys, bool) {
	d := store.DeviceKeys{UserID: user}
	var reg, spk, lr int64
	if !sc.Scan(&d.DeviceID, &reg, &d.IdentityKey, &spk, &d.SignedPreKey.Key, &d.SignedPreKey.Sig,
		&lr, &d.LastResortKEM.Key, &d.LastResortKEM.Sig, &d.UpdatedAt, &d.AccountKey, &d.DeviceSig) {
		return d, false
	}
	d.RegistrationID, d.SignedPreKey.ID, d.LastResortKEM.ID = uint32(reg), uint32(spk), uint32(lr)
	return d, true
}

func (s *Store) device(ctx context.Context, user, device string) (store.DeviceKeys, bool, error) {
	it := s.q(ctx, selectDevice+` WHERE user_id = ? AND device_id = ?`, user, device).Iter()
	d, ok := scanDevice(user, it)
	if err := it.Close(); err != nil {
		return d, false, err
	}
	return d, ok, nil
}

// UploadKeys stores a device's keys (see store.KeyDirectory).
func (s *Store) UploadKeys(ctx context.Context, user, device string, up store.KeyUpload) (store.UploadResult, error) {
	const op = "upload keys"
	var res store.UploadResult
	err := func() error {
		cur, found, err := s.device(ctx, user, device)
		if err != nil {
			return err
		}
		cur, res.NewDevice, res.IdentityChanged, err = up.Apply(user, device, cur, found)
		if err != nil {
			return err
		}
		if res.IdentityChanged {
			if err := s.q(ctx, `DELETE FROM e2e_prekeys WHERE user_id = ? AND device_id = ?`, user, device).Exec(); err != nil {
				return err
			}
		}
		err = s.q(ctx, `INSERT INTO e2e_devices (user_id, device_id, reg_id, identity_key, spk_id, spk, spk_sig, lr_id, lr_key, lr_sig, updated_at, account_key, device_sig)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, user, device, int64(cur.RegistrationID), cur.IdentityKey,
			int64(cur.SignedPreKey.ID), cur.SignedPreKey.Key, cur.SignedPreKey.Sig,
			int64(cur.LastResortKEM.ID), cur.LastResortKEM.Key, cur.LastResortKEM.Sig, cur.UpdatedAt,
			cur.AccountKey, cur.DeviceSig).Exec()
		if err != nil {
			return err
		}
		// One partition: an unlogged batch is a single mutation.
		if n := len(up.PreKeys) + len(up.KEMPreKeys); n > 0 {
			b := s.sess.Batch(gocql.UnloggedBatch).WithContext(ctx)
			b.SetConsistency(s.cons)
			const ins = `INSERT INTO e2e_prekeys (user_id, device_id, kind, key_id, pub, sig) VALUES (?, ?, ?, ?, ?, ?)`
			for _, p := range up.PreKeys {
				b.Query(ins, user, device, kindPreKey, int64(p.ID), p.Key, p.Sig)
			}
			for _, p := range up.KEMPreKeys {
				b.Query(ins, user, device, kindKEM, int64(p.ID), p.Key, p.Sig)
			}
			if err := b.Exec(); err != nil {
				return err
			}
		}
		res.Device = cur
		if res.PreKeys, err = s.countKeys(ctx, user, device, kindPreKey); err != nil {
			return err
		}
		res.KEMPreKeys, err = s.countKeys(ctx, user, device, kindKEM)
		return err
	}()
	if err != nil {
		return store.UploadResult{}, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return res, nil
}

func (s *Store) countKeys(ctx context.Context, user, device string, kind int8) (int, error) {
	var n int64
	err := s.q(ctx, `SELECT COUNT(*) FROM e2e_prekeys WHERE user_id = ? AND device_id = ? AND kind = ?`, user, device, kind).Scan(&n)
	return int(n), err
}

// take hands out the lowest-id key of kind that this call manages to
// delete (LWT), or nil when there is none.
func (s *Store) take(ctx context.Context, user, device string, kind int8) (*store.PreKey, error) {
	for attempt := 0; attempt < takeAttempts; attempt++ {
		it := s.q(ctx, `SELECT key_id, pub, sig FROM e2e_prekeys WHERE user_id = ? AND device_id = ? AND kind = ? LIMIT ?`,
			user, device, kind, takeCandidates).Iter()
		var cands []store.PreKey
		var id int64
		var pub, sig []byte
		for it.Scan(&id, &pub, &sig) {
			cands = append(cands, store.PreKey{ID: uint32(id), Key: pub, Sig: sig})
			pub, sig = nil, nil
		}
		if err := it.Close(); err != nil {
			return nil, err
		}
		if len(cands) == 0 {
			return nil, nil
		}
		for _, c := range cands {
			applied, err := s.lwt(ctx, `DELETE FROM e2e_prekeys WHERE user_id = ? AND device_id = ? AND kind = ? AND key_id = ? IF EXISTS`,
				user, device, kind, int64(c.ID)).MapScanCAS(map[string]any{})
			if err != nil {
				// Unknown outcome: the key may be deleted or not; either
				// way it is not handed out twice. Try the next one.
				if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
					return nil, err
				}
				continue
			}
			if applied {
				c := c
				return &c, nil
			}
		}
	}
	return nil, fmt.Errorf("no one-time key won after %d attempts (contention)", takeAttempts)
}

// TakeBundle hands out a device's bundle (see store.KeyDirectory).
func (s *Store) TakeBundle(ctx context.Context, user, device string) (store.KeyBundle, error) {
	const op = "take bundle"
	var kb store.KeyBundle
	err := func() error {
		d, found, err := s.device(ctx, user, device)
		if err != nil {
			return err
		}
		if !found {
			return store.ErrNotFound
		}
		kb.Device = d
		if kb.PreKey, err = s.take(ctx, user, device, kindPreKey); err != nil {
			return err
		}
		if kb.KEMPreKey, err = s.take(ctx, user, device, kindKEM); err != nil {
			return err
		}
		if kb.KEMPreKey == nil {
			lr := d.LastResortKEM
			kb.KEMPreKey, kb.KEMLastResort = &lr, true
		}
		if kb.PreKeys, err = s.countKeys(ctx, user, device, kindPreKey); err != nil {
			return err
		}
		kb.KEMPreKeys, err = s.countKeys(ctx, user, device, kindKEM)
		return err
	}()
	if err != nil {
		return store.KeyBundle{}, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return kb, nil
}

// KeyDevices lists a user's devices with keys, by device id.
func (s *Store) KeyDevices(ctx context.Context, user string) ([]store.DeviceKeys, error) {
	const op = "key devices"
	it := s.q(ctx, selectDevice+` WHERE user_id = ?`, user).Iter()
	var out []store.DeviceKeys
	for {
		d, ok := scanDevice(user, it)
		if !ok {
			break
		}
		out = append(out, d)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return out, nil
}

// PreKeyCounts returns a device's one-time prekey counts.
func (s *Store) PreKeyCounts(ctx context.Context, user, device string) (int, int, error) {
	const op = "prekey counts"
	a, err := s.countKeys(ctx, user, device, kindPreKey)
	if err != nil {
		return 0, 0, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	k, err := s.countKeys(ctx, user, device, kindKEM)
	if err != nil {
		return 0, 0, fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return a, k, nil
}

// RemoveDevice drops a device's keys and push registrations.
func (s *Store) RemoveDevice(ctx context.Context, user, device string) error {
	const op = "remove device"
	if err := s.pushRemove(ctx, user, device, "", ""); err != nil {
		return fmt.Errorf("cassandra: %s: %w", op, err)
	}
	if err := s.q(ctx, `DELETE FROM e2e_prekeys WHERE user_id = ? AND device_id = ?`, user, device).Exec(); err != nil {
		return fmt.Errorf("cassandra: %s: %w", op, err)
	}
	if err := s.q(ctx, `DELETE FROM e2e_devices WHERE user_id = ? AND device_id = ?`, user, device).Exec(); err != nil {
		return fmt.Errorf("cassandra: %s: %w", op, err)
	}
	return nil
}
