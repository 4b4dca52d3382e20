package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/parley-im/parley/protocol"
)

// Networked is what an engine whose calls cross the network (Cassandra)
// offers on top of Store to save round trips. Check keeps it visible.
type Networked interface {
	Store
	DeliveredRaiser
	// LastSeq returns a conversation's last seq for less than Conversation.
	LastSeq(ctx context.Context, conv uint64) (uint64, error)
	// Networked reports that calls cross the network: callers overlap
	// independent reads.
	Networked() bool
}

// Broken is implemented by engines that stop taking writes after a failure
// they cannot vouch past (Pebble after a failed WAL fsync): Check refuses
// every write once Broken returns an error.
type Broken interface {
	Broken() error
}

// Check returns engine e (named engine in errors, e.g. "pebble") behind the
// seam, where the calls of every engine are admitted and their arguments
// checked once, so that an engine's methods trust what they are given:
//
//   - the gate: a call fails with its context's error once that is done,
//     with ErrClosed after Close, and with the engine's Broken error if it
//     writes; Close waits for the calls in progress, then closes e once
//     (later Closes return nil);
//   - the arguments, as the Store documentation says (see "Arguments"):
//     an invalid id, role, kind or msg id never reaches e.
//
// The result also offers DeliveredRaiser, LastSeq and Networked when e
// implements Networked, and ConvStates when e does; e's other methods are
// reached through Engine. Errors are "<engine>: <op>: …", wrapping the
// sentinels.
func Check(engine string, e Store) Store {
	c := &checked{name: engine, e: e}
	c.broken, _ = e.(Broken)
	if n, ok := e.(Networked); ok {
		return &networked{checked: c, n: n}
	}
	return c
}

// Engine returns the engine behind a store Check returned, s otherwise.
func Engine(s Store) Store {
	switch c := s.(type) {
	case *checked:
		return c.e
	case *networked:
		return c.e
	}
	return s
}

type checked struct {
	name   string
	e      Store
	broken Broken // nil: the engine never refuses writes

	// gate is held for reading by every call and for writing by Close,
	// so Close never closes the engine under a call in progress.
	gate   sync.RWMutex
	closed bool // guarded by gate
}

// enter admits a call; on success the caller must call c.gate.RUnlock.
func (c *checked) enter(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %s: %w", c.name, op, err)
	}
	c.gate.RLock()
	if c.closed {
		c.gate.RUnlock()
		return fmt.Errorf("%s: %s: %w", c.name, op, ErrClosed)
	}
	return nil
}

// enterWrite is enter for calls that write.
func (c *checked) enterWrite(ctx context.Context, op string) error {
	if err := c.enter(ctx, op); err != nil {
		return err
	}
	if c.broken != nil {
		if err := c.broken.Broken(); err != nil {
			c.gate.RUnlock()
			return fmt.Errorf("%s: %s: store failed earlier: %w", c.name, op, err)
		}
	}
	return nil
}

func (c *checked) Close() error {
	c.gate.Lock()
	defer c.gate.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.e.Close()
}

// validDevice: a device id, or "" (the per-user position) where allowed.
func validDevice(device string, empty bool) bool {
	return (empty && device == "") || protocol.ValidID(device)
}

func validRole(r Role) bool { return r <= RoleOwner }

// validOnly returns the valid ids of users: users itself when all are.
func validOnly(users []string) []string {
	for i, u := range users {
		if protocol.ValidID(u) {
			continue
		}
		out := slices.Clone(users[:i])
		for _, u := range users[i+1:] {
			if protocol.ValidID(u) {
				out = append(out, u)
			}
		}
		return out
	}
	return users
}

func (c *checked) CreateConversation(ctx context.Context, cv Conversation, members []Member) error {
	const op = "create conversation"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if cv.Kind != Direct && cv.Kind != Group {
		return fmt.Errorf("%s: %s %d: invalid kind %d", c.name, op, cv.ID, cv.Kind)
	}
	for _, m := range members {
		if !protocol.ValidID(m.UserID) {
			return fmt.Errorf("%s: %s %d: invalid user id %q", c.name, op, cv.ID, m.UserID)
		}
		if !validRole(m.Role) {
			return fmt.Errorf("%s: %s %d: invalid role %d", c.name, op, cv.ID, m.Role)
		}
	}
	return c.e.CreateConversation(ctx, cv, members)
}

func (c *checked) Direct(ctx context.Context, a, b string, newID uint64, now int64) (Conversation, error) {
	if err := c.enterDirect(ctx, a, b); err != nil {
		return Conversation{}, err
	}
	defer c.gate.RUnlock()
	return c.e.Direct(ctx, a, b, newID, now)
}

func (c *checked) DirectE2E(ctx context.Context, a, b string, newID uint64, now int64) (Conversation, error) {
	if err := c.enterDirect(ctx, a, b); err != nil {
		return Conversation{}, err
	}
	defer c.gate.RUnlock()
	return c.e.DirectE2E(ctx, a, b, newID, now)
}

// enterDirect admits Direct and DirectE2E for the pair a, b.
func (c *checked) enterDirect(ctx context.Context, a, b string) error {
	const op = "direct"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	if !protocol.ValidID(a) || !protocol.ValidID(b) {
		c.gate.RUnlock()
		return fmt.Errorf("%s: %s: invalid user id %q or %q", c.name, op, a, b)
	}
	return nil
}

func (c *checked) Conversation(ctx context.Context, id uint64) (Conversation, error) {
	if err := c.enter(ctx, "conversation"); err != nil {
		return Conversation{}, err
	}
	defer c.gate.RUnlock()
	return c.e.Conversation(ctx, id)
}

func (c *checked) Member(ctx context.Context, convID uint64, user string) (Member, error) {
	const op = "member"
	if err := c.enter(ctx, op); err != nil {
		return Member{}, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return Member{}, fmt.Errorf("%s: %s %d: %w", c.name, op, convID, ErrNotMember)
	}
	return c.e.Member(ctx, convID, user)
}

func (c *checked) Members(ctx context.Context, convID uint64) ([]Member, error) {
	if err := c.enter(ctx, "members"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	return c.e.Members(ctx, convID)
}

func (c *checked) AddMembers(ctx context.Context, convID uint64, users []string, role Role) ([]Member, error) {
	const op = "add members"
	if err := c.enterWrite(ctx, op); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if !validRole(role) {
		return nil, fmt.Errorf("%s: %s %d: invalid role %d", c.name, op, convID, role)
	}
	for _, u := range users {
		if !protocol.ValidID(u) {
			return nil, fmt.Errorf("%s: %s %d: invalid user id %q", c.name, op, convID, u)
		}
	}
	return c.e.AddMembers(ctx, convID, users, role)
}

func (c *checked) RemoveMembers(ctx context.Context, convID uint64, users []string) ([]Member, error) {
	if err := c.enterWrite(ctx, "remove members"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	return c.e.RemoveMembers(ctx, convID, validOnly(users)) // an invalid id is no member
}

func (c *checked) SetRole(ctx context.Context, convID uint64, user string, role Role) error {
	const op = "set role"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	switch {
	case !validRole(role):
		return fmt.Errorf("%s: %s %d %s: invalid role %d", c.name, op, convID, user, role)
	case !protocol.ValidID(user):
		return fmt.Errorf("%s: %s %d %s: %w", c.name, op, convID, user, ErrNotMember)
	}
	return c.e.SetRole(ctx, convID, user, role)
}

func (c *checked) SetMuted(ctx context.Context, convID uint64, user string, muted bool) error {
	const op = "set muted"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return fmt.Errorf("%s: %s %d %s: %w", c.name, op, convID, user, ErrNotMember)
	}
	return c.e.SetMuted(ctx, convID, user, muted)
}

func (c *checked) SetTier(ctx context.Context, convID uint64, tier uint8) error {
	if err := c.enterWrite(ctx, "set tier"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	return c.e.SetTier(ctx, convID, tier)
}

func (c *checked) Append(ctx context.Context, a Append) (AppendResult, error) {
	const op = "append"
	if err := c.enterWrite(ctx, op); err != nil {
		return AppendResult{}, err
	}
	defer c.gate.RUnlock()
	m := &a.Msg
	switch {
	case !protocol.ValidID(m.Sender):
		return AppendResult{}, fmt.Errorf("%s: %s: invalid sender %q", c.name, op, m.Sender)
	case !validDevice(m.SenderDevice, true):
		return AppendResult{}, fmt.Errorf("%s: %s: invalid sender device %q", c.name, op, m.SenderDevice)
	case m.MsgID == 0:
		return AppendResult{}, fmt.Errorf("%s: %s: msg id 0", c.name, op)
	}
	if r := a.ReadBy; r != nil && (!protocol.ValidID(r.User) || !validDevice(r.Device, true)) {
		a.ReadBy = nil // no such position: not raised (ReadRaised false)
	}
	if r := a.React; r != nil && (m.TargetSeq == 0 || r.Emoji == "" || len(r.Emoji) > maxEmojiBytes) {
		return AppendResult{}, fmt.Errorf("%s: %s: a reaction needs a target and an emoji of 1-%d bytes", c.name, op, maxEmojiBytes)
	}
	if t := TurnOf(ctx); t != nil {
		if tt, ok := c.e.(TurnTaker); !ok || !tt.TakesTurns() {
			// The engine orders nothing itself: one append after another.
			defer t.Take()
			if err := t.Wait(ctx); err != nil {
				return AppendResult{}, fmt.Errorf("%s: %s: %w", c.name, op, err)
			}
		}
	}
	return c.e.Append(ctx, a)
}

// maxEmojiBytes bounds a stored reaction's emoji (one emoji with its
// modifiers and joiners).
const maxEmojiBytes = 64

func (c *checked) ReactedBy(ctx context.Context, conv uint64, user string, from, to uint64) ([]Reacted, error) {
	if err := c.enter(ctx, "reacted by"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || from > to {
		return nil, nil
	}
	return c.e.ReactedBy(ctx, conv, user, from, to)
}

func (c *checked) Pending(ctx context.Context, limit int) ([]Pending, error) {
	if err := c.enter(ctx, "pending"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	return c.e.Pending(ctx, limit)
}

func (c *checked) FanoutDone(ctx context.Context, convID uint64, seqs []uint64) error {
	if err := c.enterWrite(ctx, "fanout done"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	return c.e.FanoutDone(ctx, convID, seqs)
}

func (c *checked) Messages(ctx context.Context, convID, from, to uint64, limit int) ([]Message, error) {
	if err := c.enter(ctx, "messages"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	return c.e.Messages(ctx, convID, from, to, limit)
}

func (c *checked) Latest(ctx context.Context, convID uint64, before, floor uint64, n int) ([]Message, error) {
	if err := c.enter(ctx, "latest"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	return c.e.Latest(ctx, convID, before, floor, n)
}

func (c *checked) AsOf(ctx context.Context, convID, asOf uint64, msgs []Message) error {
	if err := c.enter(ctx, "as of"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	return c.e.AsOf(ctx, convID, asOf, msgs)
}

func (c *checked) UpdateRows(ctx context.Context, convID, seq uint64, users []string, mention bool) error {
	if err := c.enterWrite(ctx, "update rows"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	return c.e.UpdateRows(ctx, convID, seq, validOnly(users), mention) // an invalid id is no member
}

func (c *checked) UserConversations(ctx context.Context, user string) ([]ConvRow, error) {
	if err := c.enter(ctx, "user conversations"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return nil, nil
	}
	return c.e.UserConversations(ctx, user)
}

func (c *checked) SetRead(ctx context.Context, user, device string, convID, seq uint64) (uint64, error) {
	const op = "set read"
	if err := c.enterWrite(ctx, op); err != nil {
		return 0, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || !validDevice(device, true) {
		return 0, fmt.Errorf("%s: %s: invalid user %q or device %q", c.name, op, user, device)
	}
	return c.e.SetRead(ctx, user, device, convID, seq)
}

func (c *checked) Read(ctx context.Context, user, device string, convID uint64) (uint64, error) {
	if err := c.enter(ctx, "read"); err != nil {
		return 0, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || !validDevice(device, true) {
		return 0, nil
	}
	return c.e.Read(ctx, user, device, convID)
}

func (c *checked) SetDelivered(ctx context.Context, user string, convID, seq uint64) (uint64, error) {
	const op = "set delivered"
	if err := c.enterWrite(ctx, op); err != nil {
		return 0, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return 0, fmt.Errorf("%s: %s: invalid user %q", c.name, op, user)
	}
	return c.e.SetDelivered(ctx, user, convID, seq)
}

func (c *checked) Delivered(ctx context.Context, user string, convID uint64) (uint64, error) {
	if err := c.enter(ctx, "delivered"); err != nil {
		return 0, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return 0, nil
	}
	return c.e.Delivered(ctx, user, convID)
}

func (c *checked) UploadKeys(ctx context.Context, user, device string, up KeyUpload) (UploadResult, error) {
	const op = "upload keys"
	if err := c.enterWrite(ctx, op); err != nil {
		return UploadResult{}, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || !validDevice(device, false) {
		return UploadResult{}, fmt.Errorf("%s: %s: invalid user %q or device %q", c.name, op, user, device)
	}
	return c.e.UploadKeys(ctx, user, device, up)
}

func (c *checked) TakeBundle(ctx context.Context, user, device string) (KeyBundle, error) {
	const op = "take bundle"
	if err := c.enterWrite(ctx, op); err != nil {
		return KeyBundle{}, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || !validDevice(device, false) {
		return KeyBundle{}, fmt.Errorf("%s: %s: %w", c.name, op, ErrNotFound)
	}
	return c.e.TakeBundle(ctx, user, device)
}

func (c *checked) KeyDevices(ctx context.Context, user string) ([]DeviceKeys, error) {
	if err := c.enter(ctx, "key devices"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) {
		return nil, nil
	}
	return c.e.KeyDevices(ctx, user)
}

func (c *checked) PreKeyCounts(ctx context.Context, user, device string) (prekeys, kem int, err error) {
	if err := c.enter(ctx, "prekey counts"); err != nil {
		return 0, 0, err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || !validDevice(device, false) {
		return 0, 0, nil
	}
	return c.e.PreKeyCounts(ctx, user, device)
}

func (c *checked) RemoveDevice(ctx context.Context, user, device string) error {
	if err := c.enterWrite(ctx, "remove device"); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	if !protocol.ValidID(user) || !validDevice(device, false) {
		return nil // no such device: nothing to remove
	}
	return c.e.RemoveDevice(ctx, user, device)
}

// ConvStates reports the engine's conversation states (held now, evicted
// so far) where it keeps them (the server's metrics).
func (c *checked) ConvStates() (held int, evicted uint64) {
	if cs, ok := c.e.(interface{ ConvStates() (int, uint64) }); ok {
		return cs.ConvStates()
	}
	return 0, 0
}

// networked is checked for a Networked engine.
type networked struct {
	*checked
	n Networked
}

func (c *networked) Networked() bool { return c.n.Networked() }

func (c *networked) LastSeq(ctx context.Context, conv uint64) (uint64, error) {
	if err := c.enter(ctx, "last seq"); err != nil {
		return 0, err
	}
	defer c.gate.RUnlock()
	return c.n.LastSeq(ctx, conv)
}

func (c *networked) RaiseDelivered(ctx context.Context, ps []Delivered) error {
	const op = "raise delivered"
	if err := c.enterWrite(ctx, op); err != nil {
		return err
	}
	defer c.gate.RUnlock()
	for _, p := range ps {
		if !protocol.ValidID(p.User) {
			return fmt.Errorf("%s: %s: invalid user %q", c.name, op, p.User)
		}
	}
	return c.n.RaiseDelivered(ctx, ps)
}

var (
	_ Store           = (*checked)(nil)
	_ Networked       = (*networked)(nil)
	_ DeliveredRaiser = (*networked)(nil)
)

// ConvLister is implemented by stores that list every conversation (the
// embedded Pebble engine): what rebuilds a search index and lets it catch
// up after a crash.
type ConvLister interface {
	// ConvIDs returns up to limit conversation ids above after, ascending.
	ConvIDs(ctx context.Context, after uint64, limit int) ([]uint64, error)
}

// ScanConvIDs scans conversations where the engine can (a cluster
// store's table scan, in no order); errors.ErrUnsupported elsewhere. The
// gate is not held through the scan: fn reads the store, and a read lock
// held across it would deadlock against a waiting Close (a scan that
// races Close fails with the engine's error).
func (c *checked) ScanConvIDs(ctx context.Context, fn func(ids []uint64) error) error {
	if err := c.enter(ctx, "scan conversation ids"); err != nil {
		return err
	}
	c.gate.RUnlock()
	l, ok := c.e.(interface {
		ScanConvIDs(ctx context.Context, fn func(ids []uint64) error) error
	})
	if !ok {
		return fmt.Errorf("%s: scan conversation ids: %w", c.name, errors.ErrUnsupported)
	}
	return l.ScanConvIDs(ctx, fn)
}

// ConvIDs lists conversations where the engine can (ConvLister);
// errors.ErrUnsupported elsewhere.
func (c *checked) ConvIDs(ctx context.Context, after uint64, limit int) ([]uint64, error) {
	if err := c.enter(ctx, "conversation ids"); err != nil {
		return nil, err
	}
	defer c.gate.RUnlock()
	l, ok := c.e.(ConvLister)
	if !ok {
		return nil, fmt.Errorf("%s: conversation ids: %w", c.name, errors.ErrUnsupported)
	}
	if limit <= 0 {
		return nil, nil
	}
	return l.ConvIDs(ctx, after, limit)
}
