// Package access holds the operator's access list: banned users and token
// revocations (tokens of a user, or of one of the user's devices, issued
// before a time). The gateway consults it at every handshake and HTTP
// request, and closes open connections when an entry changes.
//
// The list is durable and shared: a Store keeps it (a file in the data
// directory for an embedded node, a Redis hash for a cluster), and a List
// is each process's in-memory copy. Manager writes through the Store,
// applies the change to the local List at once and calls its OnChange
// hook (the local gateway); Run polls the Store's version so that every
// other process applies the change within a poll period (PollEvery).
//
// Concurrency: List and Manager are safe for concurrent use; List.Check
// reads an immutable snapshot without locking.
package access

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/protocol"
)

// PollEvery is how often Run reads the store's version. A change made on
// another process reaches this one's connections within PollEvery plus
// one store round trip (documented as "within 2 s").
const PollEvery = 500 * time.Millisecond

// Entry is the access state of a user (Device empty) or of one device of
// a user. Times are Unix milliseconds.
type Entry struct {
	User   string `json:"user"`
	Device string `json:"device,omitempty"`
	// Banned refuses every connection and request of the user (user
	// entries only).
	Banned   bool   `json:"banned"`
	BannedAt int64  `json:"banned_at,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// RevokedBefore refuses tokens whose iat is before it: iat has second
	// precision, so a token is refused when iat < ceil(RevokedBefore /
	// 1000 s). 0: no revocation.
	RevokedBefore int64 `json:"revoked_before,omitempty"`
	UpdatedAt     int64 `json:"updated_at"`
}

// Key names an entry in a store: "user" or "user/device" (ids never
// contain a slash).
func (e Entry) Key() string { return key(e.User, e.Device) }

func key(user, device string) string {
	if device == "" {
		return user
	}
	return user + "/" + device
}

// RevokedAt reports whether a token issued at iat (Unix ms; 0 when the
// token has no iat) is revoked by e.
func (e Entry) RevokedAt(iatMS int64) bool {
	if e.RevokedBefore == 0 {
		return false
	}
	cutoff := (e.RevokedBefore + 999) / 1000 // whole seconds, rounded up
	return iatMS/1000 < cutoff
}

// Refusal is why a connection may not exist: its code (CodeBanned or
// CodeTokenRevoked) and close code.
type Refusal struct {
	Code  protocol.Code
	Close int
	Msg   string
}

// Refused reports whether user's connection as device with a token issued
// at iatMS is refused by the entries of l.
func (e Entry) refusal(device string, iatMS int64) *Refusal {
	if e.Device != "" && e.Device != device {
		return nil
	}
	if e.Banned && e.Device == "" {
		return &Refusal{Code: protocol.CodeBanned, Close: protocol.CloseBanned, Msg: "user banned by the operator"}
	}
	if e.RevokedAt(iatMS) {
		return &Refusal{Code: protocol.CodeTokenRevoked, Close: protocol.CloseTokenRevoked, Msg: "token revoked: get a new one"}
	}
	return nil
}

// List is a process's copy of the access list.
type List struct {
	snap atomic.Pointer[map[string]Entry]
	mu   sync.Mutex // serializes writers
}

// NewList returns an empty list.
func NewList() *List {
	l := &List{}
	m := map[string]Entry{}
	l.snap.Store(&m)
	return l
}

// Check returns why user's connection as device, with a token issued at
// iatMS (Unix ms, 0 if none), is refused, or nil.
func (l *List) Check(user, device string, iatMS int64) *Refusal {
	m := *l.snap.Load()
	if len(m) == 0 {
		return nil
	}
	if e, ok := m[user]; ok {
		if r := e.refusal(device, iatMS); r != nil {
			return r
		}
	}
	if device != "" {
		if e, ok := m[key(user, device)]; ok {
			return e.refusal(device, iatMS)
		}
	}
	return nil
}

// Get returns the entry of user (device empty) or of one device.
func (l *List) Get(user, device string) (Entry, bool) {
	e, ok := (*l.snap.Load())[key(user, device)]
	return e, ok
}

// Entries returns the entries of user (the user's and its devices').
func (l *List) Entries(user string) []Entry {
	var out []Entry
	for _, e := range *l.snap.Load() {
		if e.User == user {
			out = append(out, e)
		}
	}
	return out
}

// apply stores e and reports whether it changed anything.
func (l *List) apply(e Entry) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.snap.Load()
	if cur, ok := old[e.Key()]; ok && cur == e {
		return false
	}
	m := make(map[string]Entry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[e.Key()] = e
	l.snap.Store(&m)
	return true
}

// replace installs entries and returns those that changed (new or
// different; removed entries are returned with their zero state).
func (l *List) replace(entries []Entry) []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.snap.Load()
	m := make(map[string]Entry, len(entries))
	var changed []Entry
	for _, e := range entries {
		m[e.Key()] = e
		if cur, ok := old[e.Key()]; !ok || cur != e {
			changed = append(changed, e)
		}
	}
	for k, e := range old {
		if _, ok := m[k]; !ok {
			changed = append(changed, Entry{User: e.User, Device: e.Device})
		}
	}
	l.snap.Store(&m)
	return changed
}

// Store keeps the access list durably and shares it between processes.
type Store interface {
	// Put stores e durably (replacing the entry with the same key) and
	// changes the version.
	Put(ctx context.Context, e Entry) error
	// Load returns every entry.
	Load(ctx context.Context) ([]Entry, error)
	// Version changes whenever an entry does.
	Version(ctx context.Context) (string, error)
}

// Manager changes the access list through its store.
type Manager struct {
	store    Store
	list     *List
	now      func() time.Time
	log      *slog.Logger
	onChange atomic.Pointer[func(Entry)]
	version  string
	mu       sync.Mutex // serializes Put + apply, and reloads
}

// NewManager loads the list from store.
func NewManager(ctx context.Context, store Store, now func() time.Time, log *slog.Logger) (*Manager, error) {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{store: store, list: NewList(), now: now, log: log}
	if err := m.reload(ctx); err != nil {
		return nil, fmt.Errorf("access: load: %w", err)
	}
	return m, nil
}

// List is the manager's in-memory list.
func (m *Manager) List() *List { return m.list }

// OnChange sets the hook called with every entry that changes (locally or
// on another process): the gateway closes the connections it refuses.
func (m *Manager) OnChange(f func(Entry)) { m.onChange.Store(&f) }

func (m *Manager) changed(e Entry) {
	if f := m.onChange.Load(); f != nil {
		(*f)(e)
	}
}

// ErrInvalid is returned for a request the list cannot hold.
var ErrInvalid = errors.New("access: invalid request")

func (m *Manager) update(ctx context.Context, user, device string, f func(*Entry)) (Entry, error) {
	if !protocol.ValidID(user) || (device != "" && !protocol.ValidID(device)) {
		return Entry{}, fmt.Errorf("%w: user and device must be valid ids", ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.list.Get(user, device)
	if !ok {
		e = Entry{User: user, Device: device}
	}
	f(&e)
	e.UpdatedAt = m.now().UnixMilli()
	if err := m.store.Put(ctx, e); err != nil {
		return Entry{}, err
	}
	if m.list.apply(e) {
		m.changed(e)
	}
	return e, nil
}

// Ban bans user: new connections and requests are refused with
// CodeBanned, open ones closed with CloseBanned.
func (m *Manager) Ban(ctx context.Context, user, reason string) (Entry, error) {
	return m.update(ctx, user, "", func(e *Entry) {
		if !e.Banned {
			e.BannedAt = m.now().UnixMilli()
		}
		e.Banned, e.Reason = true, reason
	})
}

// Unban lifts a ban (a revocation stays).
func (m *Manager) Unban(ctx context.Context, user string) (Entry, error) {
	return m.update(ctx, user, "", func(e *Entry) { e.Banned, e.BannedAt, e.Reason = false, 0, "" })
}

// Revoke refuses the tokens of user (of one device, if device is set)
// issued before `before`; a later call moves the time (also back).
func (m *Manager) Revoke(ctx context.Context, user, device string, before time.Time) (Entry, error) {
	return m.update(ctx, user, device, func(e *Entry) { e.RevokedBefore = before.UnixMilli() })
}

// reload reads the whole list if the store's version moved, applies it and
// reports the entries that changed.
func (m *Manager) reload(ctx context.Context) error {
	v, err := m.store.Version(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if v == m.version {
		m.mu.Unlock()
		return nil
	}
	entries, err := m.store.Load(ctx)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	m.version = v
	changed := m.list.replace(entries)
	m.mu.Unlock()
	for _, e := range changed {
		m.changed(e)
	}
	return nil
}

// Run polls the store every PollEvery until ctx ends, so that changes made
// by other processes reach this one's connections. A store that cannot be
// read keeps the last list (logged).
func (m *Manager) Run(ctx context.Context) {
	tick := time.NewTicker(PollEvery)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := m.reload(rctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true
			m.log.Warn("access list: reading the store failed; keeping the last list", "err", err)
		case err == nil && failing:
			failing = false
			m.log.Info("access list: store readable again")
		}
	}
}
