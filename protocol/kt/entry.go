package kt

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Entry is one leaf of the log: a user's whole key-directory state after a
// change, under the user's label. Versions of a label count 1, 2, 3… and
// each entry after the first holds the hash of the label's previous entry,
// so a label's history is a hash chain inside the log.
type Entry struct {
	Label   [32]byte
	Version uint64   // 1, 2, 3… per label
	Prev    [32]byte // EntryHash of the label's previous entry; zero for version 1
	Time    int64    // unix milliseconds
	Account []byte   // the account key (33 bytes); empty when the user has no device left
	Devices []EntryDevice
}

// EntryDevice is one device of an entry.
type EntryDevice struct {
	ID          string
	IdentityKey []byte // 33 bytes, libsignal's serialized form
	Sig         []byte // the device certificate signature (64 bytes); empty for a device without one
}

// Limits of an entry. The id bound is the protocol's (1–64 bytes); keys are
// libsignal's 33-byte serialized form, signatures XEdDSA's 64 bytes.
const (
	MaxEntryDevices  = 1000
	maxDeviceIDBytes = 64
	accountKeySize   = 33
	identityKeySize  = 33
	deviceSigSize    = 64
	entryFormat      = 0x01
)

// ErrEntry: an entry encoding is malformed or not canonical.
var ErrEntry = errors.New("kt: bad entry")

// Validate reports why e cannot be encoded canonically: a version of 0, a
// Prev that is set for version 1 or zero after it, a negative time, a key
// or signature of the wrong size, devices not sorted by id or repeated.
func (e Entry) Validate() error {
	if e.Version == 0 {
		return fmt.Errorf("%w: version 0", ErrEntry)
	}
	if (e.Version == 1) != (e.Prev == [32]byte{}) {
		return fmt.Errorf("%w: version %d with prev %x", ErrEntry, e.Version, e.Prev[:4])
	}
	if e.Time < 0 {
		return fmt.Errorf("%w: negative time", ErrEntry)
	}
	if n := len(e.Account); n != 0 && n != accountKeySize {
		return fmt.Errorf("%w: account key of %d bytes", ErrEntry, n)
	}
	if len(e.Devices) > MaxEntryDevices {
		return fmt.Errorf("%w: %d devices", ErrEntry, len(e.Devices))
	}
	for i, d := range e.Devices {
		if len(d.ID) == 0 || len(d.ID) > maxDeviceIDBytes {
			return fmt.Errorf("%w: device id of %d bytes", ErrEntry, len(d.ID))
		}
		if i > 0 && e.Devices[i-1].ID >= d.ID {
			return fmt.Errorf("%w: devices not sorted by id or repeated (%q, %q)", ErrEntry, e.Devices[i-1].ID, d.ID)
		}
		if len(d.IdentityKey) != identityKeySize {
			return fmt.Errorf("%w: device %q: identity key of %d bytes", ErrEntry, d.ID, len(d.IdentityKey))
		}
		if n := len(d.Sig); n != 0 && n != deviceSigSize {
			return fmt.Errorf("%w: device %q: signature of %d bytes", ErrEntry, d.ID, n)
		}
	}
	return nil
}

// Marshal encodes e:
//
//	0x01 || label(32) || u64be version || prev(32) || u64be time
//	|| u8 len || account || u16be n
//	|| n × (u8 len || id || u8 len || identity_key || u8 len || sig)
//
// It is the only encoding UnmarshalEntry accepts for e. An entry that fails
// Validate encodes to bytes UnmarshalEntry refuses.
func (e Entry) Marshal() []byte {
	n := 1 + 32 + 8 + 32 + 8 + 1 + len(e.Account) + 2
	for _, d := range e.Devices {
		n += 3 + len(d.ID) + len(d.IdentityKey) + len(d.Sig)
	}
	b := make([]byte, 0, n)
	b = append(b, entryFormat)
	b = append(b, e.Label[:]...)
	b = binary.BigEndian.AppendUint64(b, e.Version)
	b = append(b, e.Prev[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(e.Time))
	b = appendShort(b, e.Account)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.Devices)))
	for _, d := range e.Devices {
		b = appendShort(b, []byte(d.ID))
		b = appendShort(b, d.IdentityKey)
		b = appendShort(b, d.Sig)
	}
	return b
}

// appendShort appends a length-prefixed field; a field over 255 bytes gets
// a length UnmarshalEntry cannot match (Validate refuses such entries).
func appendShort(b, f []byte) []byte {
	if len(f) > 255 {
		return append(b, 0xff)
	}
	b = append(b, byte(len(f)))
	return append(b, f...)
}

// UnmarshalEntry decodes an entry and refuses anything but the canonical
// encoding of a valid entry (Validate), with no trailing bytes.
func UnmarshalEntry(b []byte) (Entry, error) {
	r := entryReader{b: b}
	var e Entry
	if f := r.byte(); f != entryFormat && r.err == nil {
		return Entry{}, fmt.Errorf("%w: format %d", ErrEntry, f)
	}
	copy(e.Label[:], r.next(32))
	e.Version = r.u64()
	copy(e.Prev[:], r.next(32))
	e.Time = int64(r.u64())
	e.Account = r.short()
	n := int(r.u16())
	if r.err == nil && n > MaxEntryDevices {
		return Entry{}, fmt.Errorf("%w: %d devices", ErrEntry, n)
	}
	if n > 0 && r.err == nil {
		e.Devices = make([]EntryDevice, 0, min(n, len(r.b)/3+1))
	}
	for i := 0; i < n && r.err == nil; i++ {
		var d EntryDevice
		d.ID = string(r.short())
		d.IdentityKey = r.short()
		d.Sig = r.short()
		e.Devices = append(e.Devices, d)
	}
	if r.err != nil {
		return Entry{}, r.err
	}
	if len(r.b) != 0 {
		return Entry{}, fmt.Errorf("%w: %d trailing bytes", ErrEntry, len(r.b))
	}
	if err := e.Validate(); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// EntryHash is SHA-256 of an entry's encoding: what the next entry of the
// label holds in Prev.
func EntryHash(b []byte) [32]byte { return sha256.Sum256(b) }

// Equal reports whether e and o are the same entry.
func (e Entry) Equal(o Entry) bool { return bytes.Equal(e.Marshal(), o.Marshal()) }

// Device returns e's device with the given id.
func (e Entry) Device(id string) (EntryDevice, bool) {
	for _, d := range e.Devices {
		if d.ID == id {
			return d, true
		}
	}
	return EntryDevice{}, false
}

type entryReader struct {
	b   []byte
	err error
}

func (r *entryReader) next(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = fmt.Errorf("%w: truncated", ErrEntry)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *entryReader) byte() byte {
	v := r.next(1)
	if v == nil {
		return 0
	}
	return v[0]
}

func (r *entryReader) u16() uint16 {
	v := r.next(2)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint16(v)
}

func (r *entryReader) u64() uint64 {
	v := r.next(8)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// short reads a length-prefixed field as a fresh slice (nil when empty, so
// a decoded entry compares equal to the one that was encoded).
func (r *entryReader) short() []byte {
	n := int(r.byte())
	v := r.next(n)
	if len(v) == 0 {
		return nil
	}
	return bytes.Clone(v)
}
