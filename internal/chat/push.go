package chat

import (
	"context"
	"encoding/base64"
	"errors"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// push answers push_register and push_remove with the device's
// registrations after the change.
func (s *Service) push(ctx context.Context, c Caller, f *protocol.Frame) (*protocol.Frame, *protocol.Error) {
	if c.Admin || !protocol.ValidID(c.Device) {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "push registrations belong to a device: connect with a device id")
	}
	switch f.Type {
	case protocol.TypePushRegister:
		r := store.PushReg{UserID: c.User, DeviceID: c.Device, Provider: f.Push.Provider, Token: f.Push.Key(),
			Topic: f.Push.Topic, Sandbox: f.Push.Sandbox, UpdatedAt: s.now().UnixMilli()}
		if r.Provider == protocol.PushWebPush {
			var perr *protocol.Error
			if r.P256dh, r.Auth, perr = f.Push.WebPushKeys(); perr != nil {
				return nil, perr
			}
		}
		if _, err := s.store.PushRegister(ctx, r, s.cfg.PushPerDevice); err != nil {
			if errors.Is(err, store.ErrTooMany) {
				return nil, protocol.Errorf(protocol.CodeTooManyRegistrations, "a device holds at most %d push registrations: remove one first", s.cfg.PushPerDevice)
			}
			return nil, s.storeErr("push register", err)
		}
	case protocol.TypePushRemove:
		var provider, token string
		if f.Push != nil {
			provider, token = f.Push.Provider, f.Push.Key()
		}
		if err := s.store.PushRemove(ctx, c.User, c.Device, provider, token); err != nil {
			return nil, s.storeErr("push remove", err)
		}
	}
	regs, err := s.store.PushRegs(ctx, c.User)
	if err != nil {
		return nil, s.storeErr("push regs", err)
	}
	out := []protocol.PushRegistration{}
	for _, r := range regs {
		if r.DeviceID == c.Device {
			out = append(out, wirePushReg(r))
		}
	}
	return &protocol.Frame{Type: protocol.TypePush, Registrations: out}, nil
}

func wirePushReg(r store.PushReg) protocol.PushRegistration {
	w := protocol.PushRegistration{Provider: r.Provider, Topic: r.Topic, Sandbox: r.Sandbox, UpdatedAt: r.UpdatedAt}
	if r.Provider == protocol.PushWebPush {
		w.Endpoint = r.Token
		w.P256dh = base64.RawURLEncoding.EncodeToString(r.P256dh)
		w.Auth = base64.RawURLEncoding.EncodeToString(r.Auth)
	} else {
		w.Token = r.Token
	}
	return w
}
