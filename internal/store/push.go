package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/parley-im/parley/protocol"
)

// Device push registrations: per device, the tokens a push provider wakes
// it by (APNs, FCM, Web Push). A token (provider and token) names one
// device: registering it again from another device, or another user,
// moves it there.

// ErrTooMany: the device holds the most registrations already.
var ErrTooMany = errors.New("store: too many registrations")

// PushReg is one registration.
type PushReg struct {
	UserID, DeviceID string
	// Provider is protocol.PushAPNs, PushFCM or PushWebPush.
	Provider string
	// Token is the APNs device token, the FCM registration token or the
	// Web Push endpoint URL.
	Token string
	// Topic (APNs) is the app's bundle id; Sandbox picks APNs's
	// development environment.
	Topic   string
	Sandbox bool
	// P256dh and Auth (Web Push) are the browser's keys (RFC 8291).
	P256dh, Auth []byte
	UpdatedAt    int64 // unix ms
}

// Push is the push registration part of a Store.
type Push interface {
	// PushRegister stores r, keyed by (r.Provider, r.Token): a
	// registration of that token held by another device (of any user) is
	// removed and returned as moved; the same device's is replaced. A
	// device that holds max registrations of other tokens already fails
	// with ErrTooMany.
	PushRegister(ctx context.Context, r PushReg, max int) (moved *PushReg, err error)
	// PushRemove removes the device's registration of (provider, token),
	// or with provider "" all of the device's; removing none is no error.
	PushRemove(ctx context.Context, user, device, provider, token string) error
	// PushRegs lists a user's registrations, ordered by device, provider
	// and token.
	PushRegs(ctx context.Context, user string) ([]PushReg, error)
	// PushDrop removes the registration of (provider, token), whichever
	// device holds it, if it was last registered at or before before (a
	// token the provider rejected; one registered again since stays).
	PushDrop(ctx context.Context, provider, token string, before int64) error
}

// ValidPushReg checks a registration as every engine may trust it: valid
// ids, a known provider, and the bounds of protocol.ValidPushToken.
func ValidPushReg(r PushReg) error {
	switch {
	case !protocol.ValidID(r.UserID) || !validDevice(r.DeviceID, false):
		return fmt.Errorf("invalid user %q or device %q", r.UserID, r.DeviceID)
	case !protocol.ValidPushProvider(r.Provider):
		return fmt.Errorf("unknown push provider %q", r.Provider)
	case !protocol.ValidPushToken(r.Token):
		return fmt.Errorf("a push token of %d bytes, not 1-%d bytes of printable ASCII", len(r.Token), protocol.MaxPushTokenBytes)
	case len(r.Topic) > protocol.MaxPushTopicBytes || len(r.P256dh) > 65 || len(r.Auth) > 16:
		return errors.New("push topic or keys too long")
	}
	return nil
}

func (c *checked) PushRegister(ctx context.Context, r PushReg, max int) (*PushReg, error) {
	const op = "push register"
	if err := c.enterWrite(ctx, op); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if err := ValidPushReg(r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", c.name, op, err)
	}
	if max < 1 {
		return nil, fmt.Errorf("%s: %s: max %d is not positive", c.name, op, max)
	}
	return c.e.PushRegister(ctx, r, max)
}

func (c *checked) PushRemove(ctx context.Context, user, device, provider, token string) error {
	if err := c.enterWrite(ctx, "push remove"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || !validDevice(device, false) || provider != "" && (!protocol.ValidPushProvider(provider) || !protocol.ValidPushToken(token)) {
		return nil // no such registration
	}
	return c.e.PushRemove(ctx, user, device, provider, token)
}

func (c *checked) PushRegs(ctx context.Context, user string) ([]PushReg, error) {
	if err := c.enter(ctx, "push regs"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return nil, nil
	}
	return c.e.PushRegs(ctx, user)
}

func (c *checked) PushDrop(ctx context.Context, provider, token string, before int64) error {
	if err := c.enterWrite(ctx, "push drop"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidPushProvider(provider) || !protocol.ValidPushToken(token) {
		return nil
	}
	return c.e.PushDrop(ctx, provider, token, before)
}
