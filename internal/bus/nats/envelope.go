package nats

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/parley-im/parley/internal/bus"
)

// The envelope of a Delivery on the wire, all integers uvarint:
//
//	version(1|2) flags(kick 1, kick code 2, group 4, group full 8, untracked 16) ConvID Seq {len CoalesceKey} len(Users) {len user}...
//	[3×{len string} if kick] [code if kick code]
//	[{len List} len(Members) {{len user} join_seq}... if group] Frame...
//
// Frame is already encoded JSON and goes last, unframed, so it is never
// copied into another encoding or escaped. A group delivery is version 2:
// a node that predates it refuses the envelope (ErrRejected) instead of
// taking the group's fields for the frame, and its publisher falls back
// to a delivery with Users.
const (
	envelopeVersion      = 1
	envelopeVersionGroup = 2
	flagKick             = 1
	flagKickCode         = 2
	flagGroup            = 4
	flagGroupFull        = 8
	flagUntracked        = 16
)

var errEnvelope = errors.New("bad envelope")

func encodeDelivery(d bus.Delivery) []byte {
	n := 2 + 4*binary.MaxVarintLen64 + len(d.CoalesceKey) + len(d.Frame)
	for _, u := range d.Users {
		n += binary.MaxVarintLen64 + len(u)
	}
	var flags byte
	if d.Untracked {
		flags |= flagUntracked
	}
	if d.Kick != nil {
		flags |= flagKick
		n += 4*binary.MaxVarintLen64 + len(d.Kick.User) + len(d.Kick.Device) + len(d.Kick.Session)
		if d.Kick.Code != 0 {
			flags |= flagKickCode
		}
	}
	version := byte(envelopeVersion)
	if d.Group != nil {
		version = envelopeVersionGroup
		flags |= flagGroup
		if d.Group.Full {
			flags |= flagGroupFull
		}
		n += 2*binary.MaxVarintLen64 + len(d.Group.List)
		for _, m := range d.Group.Members {
			n += 2*binary.MaxVarintLen64 + len(m.User)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, version, flags)
	b = binary.AppendUvarint(b, d.ConvID)
	b = binary.AppendUvarint(b, d.Seq)
	b = appendString(b, d.CoalesceKey)
	b = binary.AppendUvarint(b, uint64(len(d.Users)))
	for _, u := range d.Users {
		b = appendString(b, u)
	}
	if d.Kick != nil {
		b = appendString(b, d.Kick.User)
		b = appendString(b, d.Kick.Device)
		b = appendString(b, d.Kick.Session)
		if d.Kick.Code != 0 {
			b = binary.AppendUvarint(b, uint64(d.Kick.Code))
		}
	}
	if d.Group != nil {
		b = appendString(b, d.Group.List)
		b = binary.AppendUvarint(b, uint64(len(d.Group.Members)))
		for _, m := range d.Group.Members {
			b = appendString(b, m.User)
			b = binary.AppendUvarint(b, m.JoinSeq)
		}
	}
	return append(b, d.Frame...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeDelivery parses an envelope. Frame aliases b.
func decodeDelivery(b []byte) (bus.Delivery, error) {
	var d bus.Delivery
	if len(b) < 2 {
		return d, fmt.Errorf("%w: %d bytes", errEnvelope, len(b))
	}
	if b[0] != envelopeVersion && b[0] != envelopeVersionGroup {
		return d, fmt.Errorf("%w: version %d", errEnvelope, b[0])
	}
	flags := b[1]
	if (flags&flagGroup != 0) != (b[0] == envelopeVersionGroup) {
		return d, fmt.Errorf("%w: version %d with flags %d", errEnvelope, b[0], flags)
	}
	d.Untracked = flags&flagUntracked != 0
	r := reader{b: b[2:]}
	d.ConvID = r.uvarint()
	d.Seq = r.uvarint()
	d.CoalesceKey = r.string()
	n := r.uvarint()
	// Each user takes at least its length byte: a count beyond what is left
	// is corrupt, and must not size an allocation.
	if n > uint64(len(r.b)) {
		return bus.Delivery{}, fmt.Errorf("%w: %d users in %d bytes", errEnvelope, n, len(r.b))
	}
	if n > 0 {
		d.Users = make([]string, n)
		for i := range d.Users {
			d.Users[i] = r.string()
		}
	}
	if flags&flagKick != 0 {
		d.Kick = &bus.Kick{User: r.string(), Device: r.string(), Session: r.string()}
		if flags&flagKickCode != 0 {
			d.Kick.Code = int(min(r.uvarint(), 4999))
		}
	}
	if flags&flagGroup != 0 {
		g := &bus.Group{List: r.string(), Full: flags&flagGroupFull != 0}
		n := r.uvarint()
		// Each member takes at least two bytes.
		if n > uint64(len(r.b))/2 {
			return bus.Delivery{}, fmt.Errorf("%w: %d members in %d bytes", errEnvelope, n, len(r.b))
		}
		if n > 0 {
			g.Members = make([]bus.Member, n)
			for i := range g.Members {
				g.Members[i] = bus.Member{User: r.string(), JoinSeq: r.uvarint()}
			}
		}
		d.Group = g
	}
	if r.err != nil {
		return bus.Delivery{}, r.err
	}
	if len(r.b) > 0 {
		d.Frame = r.b
	}
	return d, nil
}

// reader consumes an envelope; the first error sticks and zeroes the rest.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: truncated integer", errEnvelope)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: string of %d bytes, %d left", errEnvelope, n, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
