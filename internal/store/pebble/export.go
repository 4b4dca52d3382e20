package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// The listings of store.Exporter: plain scans of the tables.

// scanFrom calls fn for every key and value with prefix p from start on
// (nil: the prefix's first key) until fn returns false or an error.
func (s *Store) scanFrom(p, start []byte, fn func(k, v []byte) (bool, error)) error {
	lo := p
	if start != nil {
		lo = start
	}
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: lo, UpperBound: prefixEnd(p)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		more, err := fn(it.Key(), it.Value())
		if err != nil {
			it.Close()
			return err
		}
		if !more {
			break
		}
	}
	return errors.Join(it.Error(), it.Close())
}

func (s *Store) ExportConversations(ctx context.Context, after uint64, limit int) ([]store.Conversation, error) {
	if after == ^uint64(0) {
		return nil, nil
	}
	var out []store.Conversation
	err := s.scanFrom([]byte{tagConv}, convKey(after+1), func(k, v []byte) (bool, error) {
		if len(k) != 9 {
			return false, errCorrupt
		}
		c, err := decodeConv(binary.BigEndian.Uint64(k[1:]), v)
		if err != nil {
			return false, err
		}
		out = append(out, c)
		return len(out) < limit, ctx.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("pebble: export conversations: %w", err)
	}
	return out, nil
}

func (s *Store) ExportMembers(ctx context.Context, conv uint64) ([]store.Member, error) {
	var out []store.Member
	err := s.scanFrom(memberPrefix(conv), nil, func(k, v []byte) (bool, error) {
		user, ok := userOfMemberKey(k)
		if !ok {
			return false, errCorrupt
		}
		m, err := decodeMember(conv, user, v)
		out = append(out, m)
		return true, err
	})
	if err != nil {
		return nil, fmt.Errorf("pebble: export members %d: %w", conv, err)
	}
	return out, nil
}

// userAndRest splits the key after its tag at the user's 0x00.
func userAndRest(k []byte) (string, []byte, bool) {
	i := bytes.IndexByte(k[1:], 0)
	if i <= 0 {
		return "", nil, false
	}
	return string(k[1 : 1+i]), k[2+i:], true
}

func (s *Store) ExportPositions(ctx context.Context, fn func(store.Position) error) error {
	for _, tag := range []byte{tagRead, tagDelivered} {
		err := s.scanFrom([]byte{tag}, nil, func(k, v []byte) (bool, error) {
			user, rest, ok := userAndRest(k)
			if !ok || len(rest) < 8 || (tag == tagDelivered && len(rest) != 8) {
				return false, errCorrupt
			}
			seq, err := decodeUint(v)
			if err != nil {
				return false, err
			}
			p := store.Position{User: user, ConvID: binary.BigEndian.Uint64(rest), Device: string(rest[8:]), Seq: seq, Delivered: tag == tagDelivered}
			if err := fn(p); err != nil {
				return false, err
			}
			return true, ctx.Err()
		})
		if err != nil {
			return fmt.Errorf("pebble: export positions: %w", err)
		}
	}
	return nil
}

func (s *Store) ExportKeys(ctx context.Context, fn func(store.DeviceKeys, []store.PreKey, []store.PreKey) error) error {
	err := s.scanFrom([]byte{tagKeyDevice}, nil, func(k, v []byte) (bool, error) {
		user, device, ok := userAndRest(k)
		if !ok || len(device) == 0 {
			return false, errCorrupt
		}
		row, err := decodeDeviceRow(user, string(device), v)
		if err != nil {
			return false, err
		}
		var pre, kem []store.PreKey
		for _, kind := range []byte{kindPreKey, kindKEM} {
			p := preKeyPrefix(user, string(device), kind)
			err := s.scanFrom(p, nil, func(pk, pv []byte) (bool, error) {
				if len(pk) != len(p)+4 {
					return false, errCorrupt
				}
				key, err := decodePreKey(binary.BigEndian.Uint32(pk[len(p):]), pv)
				if kind == kindPreKey {
					pre = append(pre, key)
				} else {
					kem = append(kem, key)
				}
				return true, err
			})
			if err != nil {
				return false, err
			}
		}
		if err := fn(row.DeviceKeys, pre, kem); err != nil {
			return false, err
		}
		return true, ctx.Err()
	})
	if err != nil {
		return fmt.Errorf("pebble: export keys: %w", err)
	}
	return nil
}

func (s *Store) ExportAttachments(ctx context.Context, after uint64, limit int) ([]store.Attachment, error) {
	if after == ^uint64(0) {
		return nil, nil
	}
	var out []store.Attachment
	err := s.scanFrom([]byte{tagAttach}, attachKey(after+1), func(k, v []byte) (bool, error) {
		if len(k) != 9 {
			return false, errCorrupt
		}
		a, err := decodeAttachment(binary.BigEndian.Uint64(k[1:]), v)
		out = append(out, a)
		return len(out) < limit, err
	})
	if err != nil {
		return nil, fmt.Errorf("pebble: export attachments: %w", err)
	}
	return out, nil
}

func (s *Store) ExportKTKeys(ctx context.Context) ([]byte, error) {
	v, found, err := s.get(ktKeysKey)
	if err != nil {
		return nil, fmt.Errorf("pebble: export kt keys: %w", err)
	}
	if !found {
		return nil, nil
	}
	return bytes.Clone(v), nil
}

func (s *Store) ExportPushRegs(ctx context.Context) ([]store.PushReg, error) {
	regs, err := s.pushScan([]byte{tagPushReg})
	if err != nil {
		return nil, fmt.Errorf("pebble: export push registrations: %w", err)
	}
	return regs, nil
}

var _ store.Exporter = (*Store)(nil)
