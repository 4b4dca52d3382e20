package pebble

import (
	"context"
	"encoding/binary"
	"fmt"

	cpebble "github.com/cockroachdb/pebble/v2"

	"github.com/parley-im/parley/internal/store"
)

// mine reads user's emojis on seq of conv (the A row).
func (s *Store) mine(conv uint64, user string, seq uint64) ([]string, error) {
	v, found, err := s.get(reactedKey(conv, user, seq))
	if err != nil || !found {
		return nil, err
	}
	return decodeEmojis(v)
}

// reactCheck wraps check for a reaction: the target as check accepts it,
// with r applied to its counts; *next receives the reactor's set after it.
func reactCheck(check func(store.Message) (store.Message, error), mine []string, r store.React, next *[]string) func(store.Message) (store.Message, error) {
	return func(t store.Message) (store.Message, error) {
		if check != nil {
			var err error
			if t, err = check(t); err != nil {
				return t, err
			}
		}
		t, n, err := store.ApplyReact(t, mine, r)
		*next = n
		return t, err
	}
}

// setMine adds user's set on seq (nil: none) to b.
func setMine(b *cpebble.Batch, conv uint64, user string, seq uint64, emojis []string) error {
	k := reactedKey(conv, user, seq)
	if len(emojis) == 0 {
		return b.Delete(k, nil)
	}
	return b.Set(k, encodeEmojis(emojis), nil)
}

// ReactedBy lists user's reactions to the messages of conv in [from, to].
func (s *Store) ReactedBy(ctx context.Context, conv uint64, user string, from, to uint64) ([]store.Reacted, error) {
	const op = "reacted by"
	p := reactedPrefix(conv, user)
	upper := prefixEnd(p)
	if to < ^uint64(0) {
		upper = reactedKey(conv, user, to+1)
	}
	it, err := s.db.NewIter(&cpebble.IterOptions{LowerBound: reactedKey(conv, user, from), UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	var out []store.Reacted
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		v, verr := it.ValueAndErr()
		if verr != nil {
			err = verr
			break
		}
		es, derr := decodeEmojis(v)
		if derr != nil || len(k) != len(p)+8 {
			err = fmt.Errorf("reaction key %x: %w", k, errCorrupt)
			break
		}
		out = append(out, store.Reacted{Seq: binary.BigEndian.Uint64(k[len(p):]), Emojis: es})
	}
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("pebble: %s: %w", op, err)
	}
	return out, nil
}
