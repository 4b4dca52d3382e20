package thumb

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// exifSegment is an APP1 Exif segment whose IFD0 holds a filler tag and
// the orientation o, in byte order bo.
func exifSegment(o uint16, bo binary.AppendByteOrder) []byte {
	t := []byte("II*\x00")
	if bo == binary.BigEndian {
		t = []byte("MM\x00*")
	}
	t = bo.AppendUint32(t, 8)
	t = bo.AppendUint16(t, 2)
	entry := func(tag, typ uint16, count uint32, v uint16) {
		t = bo.AppendUint16(t, tag)
		t = bo.AppendUint16(t, typ)
		t = bo.AppendUint32(t, count)
		t = bo.AppendUint16(t, v)
		t = append(t, 0, 0)
	}
	entry(0x010f, 2, 1, 0) // Make, an ASCII string
	entry(0x0112, 3, 1, o)
	t = bo.AppendUint32(t, 0) // no next IFD
	seg := append([]byte("Exif\x00\x00"), t...)
	return append([]byte{0xff, 0xe1, byte((len(seg) + 2) >> 8), byte(len(seg) + 2)}, seg...)
}

// withExif inserts an Exif segment after a JPEG's SOI.
func withExif(jpg []byte, o uint16, bo binary.AppendByteOrder) []byte {
	return append(append(append([]byte(nil), jpg[:2]...), exifSegment(o, bo)...), jpg[2:]...)
}

func TestOrientation(t *testing.T) {
	jpg := encode(t, "jpeg", halves(8, 8, 255))
	for o := uint16(1); o <= 8; o++ {
		for _, bo := range []binary.AppendByteOrder{binary.LittleEndian, binary.BigEndian} {
			if got := orientation(withExif(jpg, o, bo)); got != int(o) {
				t.Errorf("orientation %d (%v) read as %d", o, bo, got)
			}
		}
	}
	full := withExif(jpg, 6, binary.BigEndian)
	for name, b := range map[string][]byte{
		"no exif":         jpg,
		"value 0":         withExif(jpg, 0, binary.BigEndian),
		"value 9":         withExif(jpg, 9, binary.LittleEndian),
		"not a jpeg":      encode(t, "png", halves(8, 8, 255)),
		"cut in the exif": full[:2+4+20],
		"empty":           nil,
	} {
		if got := orientation(b); got != 1 {
			t.Errorf("%s: orientation %d, want 1", name, got)
		}
	}
	// The orientation as a LONG is not one.
	seg := exifSegment(6, binary.BigEndian)
	i := bytes.Index(seg, []byte{0x01, 0x12, 0x00, 0x03})
	seg[i+3] = 4
	if got := orientation(append(append([]byte{0xff, 0xd8}, seg...), jpg[2:]...)); got != 1 {
		t.Errorf("orientation of type LONG read as %d, want 1", got)
	}
}

// TestMakeOrientation: a photo stored sideways comes out as displayed,
// and Probe gives its displayed dimensions.
func TestMakeOrientation(t *testing.T) {
	jpg := encode(t, "jpeg", halves(60, 20, 255)) // red left, blue right
	red, blue := [3]int{255, 0, 0}, [3]int{0, 0, 255}
	tests := []struct {
		o           uint16
		w, h        int
		first, last [3]int // at the middle of the first and last quarters of the longest side
	}{
		{1, 60, 20, red, blue},
		{2, 60, 20, blue, red},
		{3, 60, 20, blue, red},
		{4, 60, 20, red, blue},
		{5, 20, 60, red, blue},
		{6, 20, 60, red, blue},
		{7, 20, 60, blue, red},
		{8, 20, 60, blue, red},
	}
	for _, tc := range tests {
		b := withExif(jpg, tc.o, binary.LittleEndian)
		if c, err := Probe(bytes.NewReader(b)); err != nil || c != (Config{"jpeg", tc.w, tc.h}) {
			t.Errorf("orientation %d: Probe = %+v, %v; want %dx%d", tc.o, c, err, tc.w, tc.h)
		}
		out, w, h, err := Make(bytes.NewReader(b), 1<<20, 320)
		if err != nil || w != tc.w || h != tc.h {
			t.Fatalf("orientation %d: Make = %dx%d, %v; want %dx%d", tc.o, w, h, err, tc.w, tc.h)
		}
		img := decodeThumb(t, out, w, h)
		first, last := img.At(w/4, h/2), img.At(3*w/4, h/2)
		if h > w {
			first, last = img.At(w/2, h/4), img.At(w/2, 3*h/4)
		}
		if !near(first, tc.first[0], tc.first[1], tc.first[2]) || !near(last, tc.last[0], tc.last[1], tc.last[2]) {
			t.Errorf("orientation %d: %v then %v, want about %v then %v", tc.o, first, last, tc.first, tc.last)
		}
	}
}

// FuzzOrientation: any bytes give an orientation 1..8, never a panic.
func FuzzOrientation(f *testing.F) {
	jpg := encode(f, "jpeg", halves(4, 4, 255))
	f.Add(withExif(jpg, 6, binary.BigEndian))
	f.Add(withExif(jpg, 3, binary.LittleEndian))
	f.Add(jpg)
	f.Add([]byte{0xff, 0xd8, 0xff, 0xff, 0xff, 0xe1, 0x00, 0x02})
	f.Fuzz(func(t *testing.T, b []byte) {
		if o := orientation(b); o < 1 || o > 8 {
			t.Fatalf("orientation %d", o)
		}
	})
}
