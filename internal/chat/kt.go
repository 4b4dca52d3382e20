package chat

import (
	"bytes"
	"context"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Key transparency (internal/kt): every directory change is appended to
// the log, and every bundles and devices answer carries the asked user's
// latest entry with its inclusion proof, after making sure that entry is
// the directory's current state.

// ktFor returns the kt object of an answer about user, whose devices the
// answer was built from devs (nil when key transparency is off).
func (s *Service) ktFor(ctx context.Context, user string, devs []store.DeviceKeys) (*protocol.KTProof, *protocol.Error) {
	if s.kt == nil {
		return nil, nil
	}
	p, err := s.kt.Ensure(ctx, user, devs, func(ctx context.Context) ([]store.DeviceKeys, error) {
		return s.store.KeyDevices(ctx, user)
	})
	if err != nil {
		return nil, s.storeErr("key transparency", err)
	}
	return p, nil
}

// ktChanged appends user's new directory state after a change. Best
// effort: a failure is logged, and the next answer about the user appends
// it (Ensure heals).
func (s *Service) ktChanged(ctx context.Context, user string) {
	if s.kt == nil {
		return
	}
	devs, err := s.store.KeyDevices(ctx, user)
	if err == nil {
		_, err = s.kt.Ensure(ctx, user, devs, func(ctx context.Context) ([]store.DeviceKeys, error) {
			return s.store.KeyDevices(ctx, user)
		})
	}
	if err != nil {
		s.log.Warn("key transparency: append after a directory change failed; the next answer about the user appends it", "user", user, "err", err)
	}
}

// ktRequest answers kt_keys, kt_consistency and kt_leaves.
func (s *Service) ktRequest(ctx context.Context, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if s.kt == nil {
		return nil, protocol.Errorf(protocol.CodeNotFound, "key transparency is off on this server")
	}
	var (
		p   *protocol.KTProof
		err error
	)
	switch f.Type {
	case protocol.TypeKTKeys:
		k := s.kt.Keys()
		return &protocol.Frame{Type: protocol.TypeKTKeys, KTKeys: &k}, nil
	case protocol.TypeKTConsistency:
		p, err = s.kt.Consistency(ctx, f.From, f.To)
		if err == nil {
			return &protocol.Frame{Type: protocol.TypeKTProof, KT: p}, nil
		}
	case protocol.TypeKTLeaves:
		p, err = s.kt.Leaves(ctx, f.From, f.Limit)
		if err == nil {
			return &protocol.Frame{Type: protocol.TypeKTLeaves, KT: p}, nil
		}
	default:
		return nil, protocol.Errorf(protocol.CodeUnknownType, "unknown frame type %q", f.Type)
	}
	return nil, s.storeErr("key transparency", err)
}

// sameAccount reports whether an upload left a device's account key and
// certificate as they were (cur nil: the device is new).
func sameAccount(cur *store.DeviceKeys, next store.DeviceKeys) bool {
	return cur != nil && bytes.Equal(cur.AccountKey, next.AccountKey) && bytes.Equal(cur.DeviceSig, next.DeviceSig)
}
