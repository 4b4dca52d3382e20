package kt

import (
	"bytes"
	"errors"
	"testing"
)

func key(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func sampleEntry() Entry {
	e := Entry{Version: 2, Time: 1_700_000_000_000, Account: key(5, 33)}
	e.Label[0], e.Prev[0] = 1, 2
	e.Devices = []EntryDevice{
		{ID: "laptop", IdentityKey: key(7, 33), Sig: key(8, 64)},
		{ID: "phone", IdentityKey: key(9, 33)},
	}
	return e
}

func TestEntryRoundTrip(t *testing.T) {
	for _, e := range []Entry{
		sampleEntry(),
		{Version: 1, Label: [32]byte{3}}, // no device left
		{Version: 1, Account: key(5, 33), Devices: []EntryDevice{{ID: "d", IdentityKey: key(1, 33), Sig: key(2, 64)}}},
	} {
		b := e.Marshal()
		got, err := UnmarshalEntry(b)
		if err != nil {
			t.Fatalf("UnmarshalEntry(Marshal(%+v)): %v", e, err)
		}
		if !got.Equal(e) || !bytes.Equal(got.Marshal(), b) {
			t.Fatalf("round trip: got %+v, want %+v", got, e)
		}
	}
}

func TestEntryRefused(t *testing.T) {
	mod := func(f func(*Entry)) []byte {
		e := sampleEntry()
		f(&e)
		return e.Marshal()
	}
	good := sampleEntry().Marshal()
	cases := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated", good[:len(good)-1]},
		{"trailing byte", append(bytes.Clone(good), 0)},
		{"format 2", append([]byte{2}, good[1:]...)},
		{"version 0", mod(func(e *Entry) { e.Version = 0 })},
		{"version 1 with prev", mod(func(e *Entry) { e.Version = 1 })},
		{"version 2 without prev", mod(func(e *Entry) { e.Prev = [32]byte{} })},
		{"negative time", mod(func(e *Entry) { e.Time = -1 })},
		{"account of 32 bytes", mod(func(e *Entry) { e.Account = key(5, 32) })},
		{"devices unsorted", mod(func(e *Entry) { e.Devices[0], e.Devices[1] = e.Devices[1], e.Devices[0] })},
		{"device repeated", mod(func(e *Entry) { e.Devices[1].ID = e.Devices[0].ID })},
		{"empty device id", mod(func(e *Entry) { e.Devices[0].ID = "" })},
		{"device id of 65 bytes", mod(func(e *Entry) { e.Devices[1].ID = string(key('z', 65)) })},
		{"identity key of 32 bytes", mod(func(e *Entry) { e.Devices[0].IdentityKey = key(7, 32) })},
		{"signature of 63 bytes", mod(func(e *Entry) { e.Devices[0].Sig = key(8, 63) })},
		{"key of 300 bytes", mod(func(e *Entry) { e.Devices[0].IdentityKey = key(7, 300) })},
		{"device count past the data", func() []byte {
			b := bytes.Clone(good)
			// the u16 count sits right after the account field
			off := 1 + 32 + 8 + 32 + 8 + 1 + 33
			b[off+1]++
			return b
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if e, err := UnmarshalEntry(c.b); !errors.Is(err, ErrEntry) {
				t.Fatalf("UnmarshalEntry = %+v, %v; want ErrEntry", e, err)
			}
		})
	}
}

func TestEntryHashChains(t *testing.T) {
	e1 := Entry{Version: 1, Account: key(5, 33)}
	b1 := e1.Marshal()
	e2 := Entry{Version: 2, Prev: EntryHash(b1), Account: key(5, 33)}
	if e2.Prev == [32]byte{} {
		t.Fatal("zero hash")
	}
	if EntryHash(b1) == EntryHash(e2.Marshal()) {
		t.Fatal("two entries hash alike")
	}
}

// FuzzUnmarshalEntry: the decoder never panics, and whatever it accepts
// re-encodes to the same bytes (one encoding per entry).
func FuzzUnmarshalEntry(f *testing.F) {
	f.Add(sampleEntry().Marshal())
	f.Add(Entry{Version: 1}.Marshal())
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := UnmarshalEntry(b)
		if err != nil {
			return
		}
		if got := e.Marshal(); !bytes.Equal(got, b) {
			t.Fatalf("accepted %x, re-encodes to %x", b, got)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("accepted an entry Validate refuses: %v", err)
		}
	})
}
