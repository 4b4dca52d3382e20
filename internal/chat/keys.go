package chat

import (
	"bytes"
	"context"
	"errors"
	"slices"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/protocol/e2ekeys"
)

// The E2E key directory: devices publish their public keys, other
// devices fetch bundles to start sessions with them while they are offline.
// The server checks every signature against the device's identity key, so
// a bundle it hands out is at least self-consistent; clients check again.

func (s *Service) keys(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	switch f.Type {
	case protocol.TypeKeysUpload:
		return s.keysUpload(ctx, c, f.Keys)
	case protocol.TypeKeysBundle:
		return s.keysBundle(ctx, c, f.UserID, f.DeviceID)
	case protocol.TypeKeysDevices:
		if perr := s.mayFetchKeys(ctx, c, f.UserID); perr != nil {
			return nil, perr
		}
		devs, err := s.store.KeyDevices(ctx, f.UserID)
		if err != nil {
			return nil, s.storeErr("key devices", err)
		}
		out := make([]protocol.DeviceKeyInfo, len(devs))
		for i, d := range devs {
			out[i] = protocol.DeviceKeyInfo{DeviceID: d.DeviceID, RegistrationID: d.RegistrationID, IdentityKey: d.IdentityKey,
				AccountKey: d.AccountKey, DeviceSig: d.DeviceSig, UpdatedAt: d.UpdatedAt}
		}
		p, perr := s.ktFor(ctx, f.UserID, devs)
		if perr != nil {
			return nil, perr
		}
		return &protocol.Frame{Type: protocol.TypeDevices, UserID: f.UserID, Devices: out, KT: p}, nil
	case protocol.TypeKeysRemove:
		devs, err := s.store.KeyDevices(ctx, c.User)
		if err != nil {
			return nil, s.storeErr("key devices", err)
		}
		if err := s.store.RemoveDevice(ctx, c.User, c.Device); err != nil {
			return nil, s.storeErr("remove device", err)
		}
		for _, d := range devs {
			if d.DeviceID == c.Device {
				s.ktChanged(ctx, c.User)
				s.announceKeys(ctx, c, c.Device, "device_removed")
			}
		}
		return &protocol.Frame{Type: protocol.TypeKeys, KeyCounts: &protocol.KeyCounts{}}, nil
	}
	return nil, protocol.Errorf(protocol.CodeUnknownType, "unknown frame type %q", f.Type)
}

func verifySigned(identity []byte, p *protocol.PreKey, what string) *protocol.Error {
	id, err := e2ekeys.DecodePublicKey(identity)
	if err != nil {
		return protocol.Errorf(protocol.CodeBadKey, "identity key: %v", err)
	}
	if !id.Verify(p.Key, p.Sig) {
		return protocol.Errorf(protocol.CodeBadKey, "the signature of %s %d does not verify with the identity key", what, p.ID)
	}
	return nil
}

func toStore(p *protocol.PreKey) *store.PreKey {
	if p == nil {
		return nil
	}
	return &store.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig}
}

func fromStore(p *store.PreKey) *protocol.PreKey {
	if p == nil {
		return nil
	}
	return &protocol.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig}
}

func (s *Service) keysUpload(ctx context.Context, c Caller, k *protocol.KeyUpload) (*protocol.Frame, *protocol.Error) {
	devs, err := s.store.KeyDevices(ctx, c.User)
	if err != nil {
		return nil, s.storeErr("key devices", err)
	}
	var cur *store.DeviceKeys
	for i := range devs {
		if devs[i].DeviceID == c.Device {
			cur = &devs[i]
		}
	}
	identity := k.IdentityKey
	switch {
	case cur == nil && (k.IdentityKey == nil || k.SignedPreKey == nil || k.LastResortKEM == nil || k.RegistrationID == 0 ||
		k.AccountKey == nil || k.DeviceSig == nil):
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a device's first keys_upload needs registration_id, identity_key, account_key, device_sig, signed_prekey and last_resort_kem")
	case cur == nil && len(devs) >= protocol.MaxKeyDevices:
		return nil, protocol.Errorf(protocol.CodeTooLarge, "a user has at most %d devices with keys", protocol.MaxKeyDevices)
	case cur != nil && identity == nil:
		identity = cur.IdentityKey
	case cur != nil && !bytes.Equal(identity, cur.IdentityKey) && (k.SignedPreKey == nil || k.LastResortKEM == nil):
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a new identity_key needs a new signed_prekey and last_resort_kem in the same upload")
	}
	if k.SignedPreKey != nil {
		if perr := verifySigned(identity, k.SignedPreKey, "signed_prekey"); perr != nil {
			return nil, perr
		}
	}
	if k.LastResortKEM != nil {
		if perr := verifySigned(identity, k.LastResortKEM, "last_resort_kem"); perr != nil {
			return nil, perr
		}
	}
	for i := range k.KEMPreKeys {
		if perr := verifySigned(identity, &k.KEMPreKeys[i], "kem_prekey"); perr != nil {
			return nil, perr
		}
	}
	if cur != nil && bytes.Equal(identity, cur.IdentityKey) {
		pk, kem, err := s.store.PreKeyCounts(ctx, c.User, c.Device)
		if err != nil {
			return nil, s.storeErr("prekey counts", err)
		}
		if pk+len(k.PreKeys) > protocol.MaxStoredPreKeys || kem+len(k.KEMPreKeys) > protocol.MaxStoredPreKeys {
			return nil, protocol.Errorf(protocol.CodeTooLarge, "a device holds at most %d one-time prekeys of each kind", protocol.MaxStoredPreKeys)
		}
	}
	replaced, perr := s.checkAccount(c, k, cur, identity, devs)
	if perr != nil {
		return nil, perr
	}
	up := store.KeyUpload{RegistrationID: k.RegistrationID, IdentityKey: k.IdentityKey,
		AccountKey: k.AccountKey, DeviceSig: k.DeviceSig,
		SignedPreKey: toStore(k.SignedPreKey), LastResortKEM: toStore(k.LastResortKEM), Now: s.now().UnixMilli()}
	for _, p := range k.PreKeys {
		up.PreKeys = append(up.PreKeys, store.PreKey{ID: p.ID, Key: p.Key})
	}
	for _, p := range k.KEMPreKeys {
		up.KEMPreKeys = append(up.KEMPreKeys, store.PreKey{ID: p.ID, Key: p.Key, Sig: p.Sig})
	}
	// The other devices go first: a crash between the two leaves the
	// account without them rather than with two account keys.
	for _, d := range replaced {
		if err := s.store.RemoveDevice(ctx, c.User, d); err != nil {
			return nil, s.storeErr("remove device", err)
		}
		s.announceKeys(ctx, c, d, "device_removed")
	}
	res, err := s.store.UploadKeys(ctx, c.User, c.Device, up)
	if err != nil {
		return nil, s.storeErr("upload keys", err)
	}
	if len(replaced) > 0 || res.NewDevice || res.IdentityChanged || !sameAccount(cur, res.Device) {
		s.ktChanged(ctx, c.User)
	}
	switch {
	case res.NewDevice:
		s.announceKeys(ctx, c, c.Device, "device_added")
	case res.IdentityChanged:
		s.announceKeys(ctx, c, c.Device, "identity_changed")
	}
	return &protocol.Frame{Type: protocol.TypeKeys, KeyCounts: &protocol.KeyCounts{PreKeys: res.PreKeys, KEMPreKeys: res.KEMPreKeys}}, nil
}

// checkAccount applies the account rules to an upload whose identity key
// is identity (the stored one when the upload has none): the device's
// certificate must verify with its account key whenever the identity or
// the account key changes, and all of a user's devices share one account
// key. It returns the other devices replace_account removes.
func (s *Service) checkAccount(c Caller, k *protocol.KeyUpload, cur *store.DeviceKeys, identity []byte, devs []store.DeviceKeys) ([]string, *protocol.Error) {
	account := k.AccountKey
	var stored []byte
	if cur != nil {
		stored = cur.AccountKey
	}
	if account == nil {
		account = stored
	}
	if account == nil {
		if k.DeviceSig != nil {
			return nil, protocol.Errorf(protocol.CodeBadKey, "device_sig without an account_key")
		}
		// A device stored before account keys may refill; a new identity
		// comes certified.
		if cur == nil || !bytes.Equal(identity, cur.IdentityKey) {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a new identity_key needs account_key and device_sig certifying the device")
		}
		return nil, nil
	}
	changed := cur == nil || !bytes.Equal(account, stored) || !bytes.Equal(identity, cur.IdentityKey)
	if changed && k.DeviceSig == nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "a new identity_key or account_key needs a device_sig certifying the device")
	}
	if k.DeviceSig != nil && !e2ekeys.VerifyDeviceCert(account, c.User, c.Device, identity, k.DeviceSig) {
		return nil, protocol.Errorf(protocol.CodeBadKey, "device_sig does not verify with the account key over this device's certificate")
	}
	var others []string
	for _, d := range devs {
		if d.DeviceID != c.Device && !bytes.Equal(d.AccountKey, account) {
			if len(d.AccountKey) > 0 && !k.ReplaceAccount {
				return nil, protocol.Errorf(protocol.CodeAccountConflict,
					"%s's other devices are certified by another account key: link this device with it, or start the account over with replace_account", c.User)
			}
			if k.ReplaceAccount {
				others = append(others, d.DeviceID)
			}
		}
	}
	return others, nil
}

// mayFetchKeys: a user's keys are for the user and for the users who share
// a conversation with them (as for presence), so strangers cannot drain a
// device's one-time prekeys.
func (s *Service) mayFetchKeys(ctx context.Context, c Caller, user string) *protocol.Error {
	ok, err := s.SharesConversation(ctx, c.User, user)
	if err != nil {
		return s.storeErr("key access", err)
	}
	if !ok {
		return protocol.Errorf(protocol.CodeForbidden, "you share no conversation with %s", user)
	}
	return nil
}

func (s *Service) keysBundle(ctx context.Context, c Caller, user, device string) (*protocol.Frame, *protocol.Error) {
	if perr := s.mayFetchKeys(ctx, c, user); perr != nil {
		return nil, perr
	}
	var devs []store.DeviceKeys // read once, when needed
	keyDevices := func() ([]store.DeviceKeys, *protocol.Error) {
		if devs != nil {
			return devs, nil
		}
		d, err := s.store.KeyDevices(ctx, user)
		if err != nil {
			return nil, s.storeErr("key devices", err)
		}
		devs = d
		return devs, nil
	}
	var devices []string
	if device != "" {
		devices = []string{device}
	} else {
		all, perr := keyDevices()
		if perr != nil {
			return nil, perr
		}
		for _, d := range all {
			if user != c.User || d.DeviceID != c.Device {
				devices = append(devices, d.DeviceID)
			}
		}
	}
	out := make([]protocol.KeyBundle, 0, len(devices))
	for _, d := range devices {
		ok, perr := s.mayTakePrekeys(ctx, c, user, d)
		if perr != nil {
			return nil, perr
		}
		if !ok {
			all, perr := keyDevices()
			if perr != nil {
				return nil, perr
			}
			i := slices.IndexFunc(all, func(k store.DeviceKeys) bool { return k.DeviceID == d })
			if i < 0 {
				if device != "" {
					return nil, protocol.Errorf(protocol.CodeNotFound, "%s/%s has no keys", user, d)
				}
				continue // removed meanwhile
			}
			k := all[i]
			out = append(out, protocol.KeyBundle{UserID: user, DeviceID: d, RegistrationID: k.RegistrationID,
				IdentityKey: k.IdentityKey, AccountKey: k.AccountKey, DeviceSig: k.DeviceSig, SignedPreKey: *fromStore(&k.SignedPreKey),
				KEMPreKey: fromStore(&k.LastResortKEM), KEMLastResort: true, Limited: true})
			continue
		}
		kb, err := s.store.TakeBundle(ctx, user, d)
		if errors.Is(err, store.ErrNotFound) {
			if device != "" {
				return nil, protocol.Errorf(protocol.CodeNotFound, "%s/%s has no keys", user, d)
			}
			continue // removed meanwhile
		}
		if err != nil {
			return nil, s.storeErr("take bundle", err)
		}
		out = append(out, protocol.KeyBundle{UserID: user, DeviceID: d, RegistrationID: kb.Device.RegistrationID,
			IdentityKey: kb.Device.IdentityKey, AccountKey: kb.Device.AccountKey, DeviceSig: kb.Device.DeviceSig, SignedPreKey: *fromStore(&kb.Device.SignedPreKey),
			PreKey: fromStore(kb.PreKey), KEMPreKey: fromStore(kb.KEMPreKey), KEMLastResort: kb.KEMLastResort})
		if kb.PreKeys < protocol.KeysLowThreshold || kb.KEMPreKeys < protocol.KeysLowThreshold {
			s.fan.Push(ctx, []string{user}, &protocol.Frame{Type: protocol.TypeKeysLow, UserID: user, DeviceID: d,
				KeyCounts: &protocol.KeyCounts{PreKeys: kb.PreKeys, KEMPreKeys: kb.KEMPreKeys}})
		}
	}
	all, perr := keyDevices()
	if perr != nil {
		return nil, perr
	}
	p, perr := s.ktFor(ctx, user, all)
	if perr != nil {
		return nil, perr
	}
	return &protocol.Frame{Type: protocol.TypeBundles, UserID: user, Bundles: out, KT: p}, nil
}

// mayTakePrekeys reports whether c may take one-time prekeys of
// user/device now: within both the requester's bound and the device's
// (Config.PrekeysPerRequester, PrekeysPerDevice). The requester's is
// checked first, so a requester past its own bound spends none of the
// device's, which its other peers share.
func (s *Service) mayTakePrekeys(ctx context.Context, c Caller, user, device string) (bool, *protocol.Error) {
	ok, _, err := s.limits.Take(ctx, "prekeys:from:"+c.User, s.cfg.PrekeysPerRequester, s.cfg.PrekeyPeriod)
	if err == nil && ok {
		ok, _, err = s.limits.Take(ctx, "prekeys:of:"+user+":"+device, s.cfg.PrekeysPerDevice, s.cfg.PrekeyPeriod)
	}
	if err != nil {
		return false, &protocol.Error{Code: protocol.CodeOverloaded, Msg: "rate limiter unavailable", RetryAfter: 1000}
	}
	return ok, nil
}

// announceKeys tells a user's contacts that the user's device list or a
// device's identity changed: a system event in each of the user's current
// E2E conversations (their clients then fetch bundles for the new device,
// or show the changed safety number). Best effort: a failure is logged.
func (s *Service) announceKeys(ctx context.Context, c Caller, device, event string) {
	rows, err := s.store.UserConversations(ctx, c.User)
	if err != nil {
		s.log.Warn("announce keys: conversations", "user", c.User, "err", err)
		return
	}
	for _, r := range rows {
		if r.LeaveSeq != 0 {
			continue
		}
		cv, err := s.store.Conversation(ctx, r.ConvID)
		if err != nil || !cv.E2E {
			continue
		}
		if _, perr := s.systemEvent(ctx, c, cv, protocol.SystemEvent{Event: event, Users: []string{c.User}, Device: device}); perr != nil {
			s.log.Warn("announce keys", "conv", cv.ID, "err", perr)
		}
	}
}
