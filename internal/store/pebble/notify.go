package pebble

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// Notification preferences (store.Notify):
//
//	T      T | user 0 conv   mute-until (8 bytes, big-endian)   conv_mutes
//	Z      Z | user          the do-not-disturb (JSON)          dnd
//
// Each is one key written on its own (no read-modify-write), synced.

const (
	tagConvMute = 'T'
	tagDND      = 'Z'
)

func convMutePrefix(user string) []byte {
	k := append(tagged(tagConvMute, len(user)+9), user...)
	return append(k, 0)
}

func convMuteKey(user string, conv uint64) []byte {
	return binary.BigEndian.AppendUint64(convMutePrefix(user), conv)
}

func dndKey(user string) []byte { return append(tagged(tagDND, len(user)+1), user...) }

func (s *Store) SetConvMute(ctx context.Context, user string, convID uint64, until int64) error {
	k := convMuteKey(user, convID)
	var err error
	if until == 0 {
		err = s.db.Delete(k, syncWrite)
	} else {
		err = s.db.Set(k, binary.BigEndian.AppendUint64(nil, uint64(until)), syncWrite)
	}
	if err != nil {
		s.fail(err)
		return fmt.Errorf("pebble: set conv mute: %w", err)
	}
	return nil
}

func (s *Store) ConvMute(ctx context.Context, user string, convID uint64) (int64, error) {
	v, found, err := s.get(convMuteKey(user, convID))
	if err != nil {
		return 0, fmt.Errorf("pebble: conv mute: %w", err)
	}
	if !found || len(v) != 8 {
		return 0, nil
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

func (s *Store) ConvMutes(ctx context.Context, user string) (map[uint64]int64, error) {
	p := convMutePrefix(user)
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return nil, fmt.Errorf("pebble: conv mutes: %w", err)
	}
	out := map[uint64]int64{}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return nil, fmt.Errorf("pebble: conv mutes: %w", err)
		}
		if len(k) != len(p)+8 || len(v) != 8 {
			continue
		}
		out[binary.BigEndian.Uint64(k[len(p):])] = int64(binary.BigEndian.Uint64(v))
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("pebble: conv mutes: %w", err)
	}
	return out, nil
}

// dndValue is a dnd value.
type dndValue struct {
	Until  int64 `json:"u,omitempty"`
	Daily  bool  `json:"d,omitempty"`
	Start  int   `json:"s,omitempty"`
	End    int   `json:"e,omitempty"`
	Offset int   `json:"o,omitempty"`
}

func (s *Store) SetDND(ctx context.Context, user string, d store.DND) error {
	var err error
	if d.Zero() {
		err = s.db.Delete(dndKey(user), syncWrite)
	} else {
		v, _ := json.Marshal(dndValue{Until: d.Until, Daily: d.Daily, Start: d.Start, End: d.End, Offset: d.Offset})
		err = s.db.Set(dndKey(user), v, syncWrite)
	}
	if err != nil {
		s.fail(err)
		return fmt.Errorf("pebble: set dnd: %w", err)
	}
	return nil
}

func (s *Store) DND(ctx context.Context, user string) (store.DND, error) {
	raw, found, err := s.get(dndKey(user))
	if err != nil {
		return store.DND{}, fmt.Errorf("pebble: dnd: %w", err)
	}
	if !found {
		return store.DND{}, nil
	}
	d, err := decodeDND(raw)
	if err != nil {
		return store.DND{}, fmt.Errorf("pebble: dnd: %w", err)
	}
	return d, nil
}

func decodeDND(raw []byte) (store.DND, error) {
	var v dndValue
	if err := json.Unmarshal(raw, &v); err != nil {
		return store.DND{}, err
	}
	return store.DND{Until: v.Until, Daily: v.Daily, Start: v.Start, End: v.End, Offset: v.Offset}, nil
}

// ExportNotify reads every mute (T rows) and do-not-disturb (Z rows), then
// calls fn by user id.
func (s *Store) ExportNotify(ctx context.Context, fn func(user string, mutes map[uint64]int64, dnd store.DND) error) error {
	mutes := map[string]map[uint64]int64{}
	dnds := map[string]store.DND{}
	err := s.scan([]byte{tagConvMute}, func(k, v []byte) error {
		k = k[1:] // user 0 conv
		if len(k) < 10 || k[len(k)-9] != 0 || len(v) != 8 {
			return fmt.Errorf("a malformed mute row %x", k)
		}
		user := string(k[:len(k)-9])
		if mutes[user] == nil {
			mutes[user] = map[uint64]int64{}
		}
		mutes[user][binary.BigEndian.Uint64(k[len(k)-8:])] = int64(binary.BigEndian.Uint64(v))
		return nil
	})
	if err == nil {
		err = s.scan([]byte{tagDND}, func(k, v []byte) error {
			k = k[1:] // user
			d, err := decodeDND(v)
			if err != nil {
				return fmt.Errorf("the do-not-disturb of %q: %w", k, err)
			}
			dnds[string(k)] = d
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("pebble: export notification preferences: %w", err)
	}
	users := make([]string, 0, len(mutes)+len(dnds))
	for u := range mutes {
		users = append(users, u)
	}
	for u := range dnds {
		if mutes[u] == nil {
			users = append(users, u)
		}
	}
	slices.Sort(users)
	for _, u := range users {
		if err := fn(u, mutes[u], dnds[u]); err != nil {
			return err
		}
	}
	return nil
}
