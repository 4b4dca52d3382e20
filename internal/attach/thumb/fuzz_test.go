package thumb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"image"
	"testing"
)

// seeds are small valid images of every format and a bomb's header.
func seeds(f *testing.F) {
	f.Add(encode(f, "png", halves(6, 4, 200)))
	f.Add(encode(f, "jpeg", halves(9, 3, 255)))
	f.Add(encode(f, "gif", halves(4, 4, 255)))
	f.Add(readFile(f, "blue-purple-pink.lossy.webp"))
	f.Add(readFile(f, "gopher-doc.with-alpha.lossless.webp"))
	f.Add(withExif(encode(f, "jpeg", halves(5, 3, 255)), 6, binary.BigEndian))
	f.Add(pngHeader(100000, 100000))
	f.Add([]byte("GIF89a"))
	f.Add([]byte("RIFF\x00\x00\x00\x00WEBPVP8 "))
}

// FuzzProbe: any bytes give a Config of a taken format with positive
// dimensions, or an error; never a panic.
func FuzzProbe(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Probe(bytes.NewReader(b))
		if err != nil {
			return
		}
		if !formats[c.Format] || c.Width <= 0 || c.Height <= 0 {
			t.Fatalf("Probe = %+v", c)
		}
	})
}

// FuzzMake: any bytes give a JPEG of the size Make reports, within the
// longest side, or an error; an image over the pixel limit is refused
// whatever follows its header.
func FuzzMake(f *testing.F) {
	seeds(f)
	const maxPixels, side = 1 << 16, 48
	f.Fuzz(func(t *testing.T, b []byte) {
		jpg, w, h, err := Make(bytes.NewReader(b), maxPixels, side)
		if c, perr := Probe(bytes.NewReader(b)); perr == nil && int64(c.Width)*int64(c.Height) > maxPixels && !errors.Is(err, ErrTooManyPixels) {
			t.Fatalf("Make of a %dx%d image: %v, want ErrTooManyPixels", c.Width, c.Height, err)
		}
		if err != nil {
			return
		}
		if w < 1 || h < 1 || max(w, h) > side {
			t.Fatalf("Make = %dx%d, longest side %d", w, h, side)
		}
		img, format, err := image.Decode(bytes.NewReader(jpg))
		if err != nil || format != "jpeg" || img.Bounds().Dx() != w || img.Bounds().Dy() != h {
			t.Fatalf("Make's output: %s %v, %v; want a %dx%d JPEG", format, img.Bounds(), err, w, h)
		}
	})
}
