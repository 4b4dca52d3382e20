package pebble

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// The E2E key directory (store.KeyDirectory):
//
//	E      E | user 0 | device                    reg id, identity, signed prekey, last-resort KEM, updated   e2e_devices, partition user
//	P      P | user 0 | device 0 | kind | id u32  key, signature                                             e2e_prekeys, partition (user, device)
//
// kind is 'e' (one-time Curve25519 prekey) or 'k' (one-time ML-KEM prekey).
// Every write to one device's keys happens under its stripe of keyLocks, so
// a one-time key read and deleted by TakeBundle cannot be handed out again:
// the next taker, serialised behind the lock, sees the deletion (pebble
// makes a batch readable when it is applied, before its fsync, and the
// answer waits for the fsync).

const (
	tagKeyDevice = 'E'
	tagPreKey    = 'P'
	kindPreKey   = 'e'
	kindKEM      = 'k'
	keyStripes   = 64
)

func (s *Store) keyLock(user, device string) *sync.Mutex {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(user)
	h.WriteByte(0)
	h.WriteString(device)
	return &s.keyLocks[h.Sum64()%keyStripes]
}

func keyDevicePrefix(user string) []byte {
	k := append(tagged(tagKeyDevice, len(user)+66), user...)
	return append(k, 0)
}

func keyDeviceKey(user, device string) []byte { return append(keyDevicePrefix(user), device...) }

func preKeyPrefix(user, device string, kind byte) []byte {
	k := append(tagged(tagPreKey, len(user)+len(device)+8), user...)
	k = append(k, 0)
	k = append(k, device...)
	k = append(k, 0)
	if kind != 0 {
		k = append(k, kind)
	}
	return k
}

func preKeyKey(user, device string, kind byte, id uint32) []byte {
	return binary.BigEndian.AppendUint32(preKeyPrefix(user, device, kind), id)
}

// deviceRow is an E value: the device's keys and how many one-time keys
// of each kind it holds (kept here so that a fetch never scans the keys).
type deviceRow struct {
	store.DeviceKeys
	preKeys, kemKeys int
}

// encodeDeviceRow appends the account key and device signature after the
// counts, only when the device has them, so rows written before account
// keys decode unchanged and re-encode to the same bytes.
func encodeDeviceRow(r deviceRow) []byte {
	b := encodeDeviceKeys(r.DeviceKeys)
	b = binary.AppendUvarint(b, uint64(r.preKeys))
	b = binary.AppendUvarint(b, uint64(r.kemKeys))
	if len(r.AccountKey) > 0 || len(r.DeviceSig) > 0 {
		b = binary.AppendUvarint(b, uint64(len(r.AccountKey)))
		b = append(b, r.AccountKey...)
		b = binary.AppendUvarint(b, uint64(len(r.DeviceSig)))
		b = append(b, r.DeviceSig...)
	}
	return b
}

func decodeDeviceRow(user, device string, b []byte) (deviceRow, error) {
	d := newDecoder(b)
	if d.err == nil && d.version != codecV2 { // key rows were born in version 2
		d.fail()
	}
	r := deviceRow{DeviceKeys: decodeDeviceFields(d, user, device)}
	r.preKeys = int(d.uint32())
	r.kemKeys = int(d.uint32())
	if d.err == nil && len(d.b) > 0 {
		r.AccountKey = []byte(d.string())
		r.DeviceSig = []byte(d.string())
		if d.err == nil && len(r.AccountKey) == 0 && len(r.DeviceSig) == 0 {
			d.fail() // written as absent
		}
	}
	if err := d.finish("device keys"); err != nil {
		return deviceRow{}, err
	}
	return r, nil
}

func encodeDeviceKeys(d store.DeviceKeys) []byte {
	e := newEncoder(256 + len(d.LastResortKEM.Key))
	e.uvarint(uint64(d.RegistrationID))
	e.string(string(d.IdentityKey))
	e.uvarint(uint64(d.SignedPreKey.ID))
	e.string(string(d.SignedPreKey.Key))
	e.string(string(d.SignedPreKey.Sig))
	e.uvarint(uint64(d.LastResortKEM.ID))
	e.string(string(d.LastResortKEM.Key))
	e.string(string(d.LastResortKEM.Sig))
	e.varint(d.UpdatedAt)
	return e.bytes()
}

func (d *decoder) uint32() uint32 {
	v := d.uvarint()
	if d.err == nil && v > 1<<32-1 {
		d.fail()
	}
	return uint32(v)
}

func decodeDeviceFields(d *decoder, user, device string) store.DeviceKeys {
	k := store.DeviceKeys{UserID: user, DeviceID: device}
	k.RegistrationID = d.uint32()
	k.IdentityKey = []byte(d.string())
	k.SignedPreKey.ID = d.uint32()
	k.SignedPreKey.Key = []byte(d.string())
	k.SignedPreKey.Sig = []byte(d.string())
	k.LastResortKEM.ID = d.uint32()
	k.LastResortKEM.Key = []byte(d.string())
	k.LastResortKEM.Sig = []byte(d.string())
	k.UpdatedAt = d.varint()
	return k
}

func encodePreKey(p store.PreKey) []byte {
	e := newEncoder(8 + len(p.Key) + len(p.Sig))
	e.string(string(p.Key))
	e.string(string(p.Sig))
	return e.bytes()
}

func decodePreKey(id uint32, b []byte) (store.PreKey, error) {
	d := newDecoder(b)
	if d.err == nil && d.version != codecV2 {
		d.fail()
	}
	p := store.PreKey{ID: id, Key: []byte(d.string()), Sig: []byte(d.string())}
	return p, d.finish("prekey")
}

// UploadKeys stores a device's keys (see store.KeyDirectory).
func (s *Store) UploadKeys(ctx context.Context, user, device string, up store.KeyUpload) (store.UploadResult, error) {
	const op = "upload keys"
	var res store.UploadResult
	mu := s.keyLock(user, device)
	mu.Lock()
	b := s.db.NewBatch()
	err := func() error {
		defer mu.Unlock()
		raw, found, err := s.get(keyDeviceKey(user, device))
		if err != nil {
			return err
		}
		var row deviceRow
		if found {
			if row, err = decodeDeviceRow(user, device, raw); err != nil {
				return err
			}
		}
		row.DeviceKeys, res.NewDevice, res.IdentityChanged, err = up.Apply(user, device, row.DeviceKeys, found)
		if err != nil {
			return err
		}
		if res.IdentityChanged {
			if err := b.DeleteRange(preKeyPrefix(user, device, 0), prefixEnd(preKeyPrefix(user, device, 0)), nil); err != nil {
				return err
			}
			row.preKeys, row.kemKeys = 0, 0
		}
		// An id already stored is replaced, not counted again.
		put := func(kind byte, keys []store.PreKey, n *int) error {
			seen := map[uint32]bool{}
			for _, p := range keys {
				k := preKeyKey(user, device, kind, p.ID)
				if !seen[p.ID] && !res.IdentityChanged {
					had, err := s.exists(k)
					if err != nil {
						return err
					}
					if !had {
						*n++
					}
				} else if !seen[p.ID] {
					*n++
				}
				seen[p.ID] = true
				if err := b.Set(k, encodePreKey(p), nil); err != nil {
					return err
				}
			}
			return nil
		}
		if err := put(kindPreKey, up.PreKeys, &row.preKeys); err != nil {
			return err
		}
		if err := put(kindKEM, up.KEMPreKeys, &row.kemKeys); err != nil {
			return err
		}
		if err := b.Set(keyDeviceKey(user, device), encodeDeviceRow(row), nil); err != nil {
			return err
		}
		if err := s.db.ApplyNoSyncWait(b, syncWrite); err != nil {
			return err
		}
		res.Device, res.PreKeys, res.KEMPreKeys = row.DeviceKeys, row.preKeys, row.kemKeys
		return nil
	}()
	if err == nil {
		if err = b.SyncWait(); err != nil {
			s.fail(err)
		}
	}
	b.Close()
	if err != nil {
		return store.UploadResult{}, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return res, nil
}

// firstPreKey returns the lowest-id prekey under prefix p.
func (s *Store) firstPreKey(p []byte) (*store.PreKey, []byte, error) {
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return nil, nil, err
	}
	defer it.Close()
	if !it.First() {
		return nil, nil, it.Error()
	}
	k := append([]byte(nil), it.Key()...)
	v, err := it.ValueAndErr()
	if err != nil {
		return nil, nil, err
	}
	if len(k) != len(p)+4 {
		return nil, nil, errCorrupt
	}
	pk, err := decodePreKey(binary.BigEndian.Uint32(k[len(p):]), v)
	if err != nil {
		return nil, nil, err
	}
	return &pk, k, nil
}

// TakeBundle hands out a device's bundle (see store.KeyDirectory).
func (s *Store) TakeBundle(ctx context.Context, user, device string) (store.KeyBundle, error) {
	const op = "take bundle"
	var kb store.KeyBundle
	mu := s.keyLock(user, device)
	mu.Lock()
	b := s.db.NewBatch()
	wrote := false
	err := func() error {
		defer mu.Unlock()
		raw, found, err := s.get(keyDeviceKey(user, device))
		if err != nil {
			return err
		}
		if !found {
			return store.ErrNotFound
		}
		row, err := decodeDeviceRow(user, device, raw)
		if err != nil {
			return err
		}
		kb.Device = row.DeviceKeys
		pk, k, err := s.firstPreKey(preKeyPrefix(user, device, kindPreKey))
		if err != nil {
			return err
		}
		if pk != nil {
			kb.PreKey = pk
			b.Delete(k, nil)
			row.preKeys--
			wrote = true
		}
		kk, k, err := s.firstPreKey(preKeyPrefix(user, device, kindKEM))
		if err != nil {
			return err
		}
		if kk != nil {
			kb.KEMPreKey = kk
			b.Delete(k, nil)
			row.kemKeys--
			wrote = true
		} else {
			lr := kb.Device.LastResortKEM
			kb.KEMPreKey, kb.KEMLastResort = &lr, true
		}
		row.preKeys, row.kemKeys = max(row.preKeys, 0), max(row.kemKeys, 0)
		if wrote {
			if err := b.Set(keyDeviceKey(user, device), encodeDeviceRow(row), nil); err != nil {
				return err
			}
			if err := s.db.ApplyNoSyncWait(b, syncWrite); err != nil {
				return err
			}
		}
		kb.PreKeys, kb.KEMPreKeys = row.preKeys, row.kemKeys
		return nil
	}()
	if err == nil && wrote {
		if err = b.SyncWait(); err != nil {
			s.fail(err)
		}
	}
	b.Close()
	if err != nil {
		return store.KeyBundle{}, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return kb, nil
}

// KeyDevices lists a user's devices with keys.
func (s *Store) KeyDevices(ctx context.Context, user string) ([]store.DeviceKeys, error) {
	const op = "key devices"
	p := keyDevicePrefix(user)
	var out []store.DeviceKeys
	err := s.scan(p, func(k, v []byte) error {
		r, err := decodeDeviceRow(user, string(k[len(p):]), v)
		if err != nil {
			return err
		}
		out = append(out, r.DeviceKeys)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return out, nil
}

// PreKeyCounts returns a device's one-time prekey counts.
func (s *Store) PreKeyCounts(ctx context.Context, user, device string) (int, int, error) {
	const op = "prekey counts"
	raw, found, err := s.get(keyDeviceKey(user, device))
	if err != nil {
		return 0, 0, fmt.Errorf("pebble: %s: %w", op, err)
	}
	if !found {
		return 0, 0, nil
	}
	r, err := decodeDeviceRow(user, device, raw)
	if err != nil {
		return 0, 0, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return r.preKeys, r.kemKeys, nil
}

// RemoveDevice drops a device's keys and push registrations.
func (s *Store) RemoveDevice(ctx context.Context, user, device string) error {
	const op = "remove device"
	s.pushMu.Lock()
	err := s.pushRemove(user, device, "", "")
	s.pushMu.Unlock()
	if err != nil {
		return fmt.Errorf("pebble: %s: %w", op, err)
	}
	mu := s.keyLock(user, device)
	mu.Lock()
	defer mu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	b.Delete(keyDeviceKey(user, device), nil)
	b.DeleteRange(preKeyPrefix(user, device, 0), prefixEnd(preKeyPrefix(user, device, 0)), nil)
	if err := b.Commit(syncWrite); err != nil {
		s.fail(err)
		return fmt.Errorf("pebble: %s: %w", op, err)
	}
	return nil
}
