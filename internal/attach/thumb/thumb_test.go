package thumb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"os"
	"runtime"
	"testing"
)

// halves is a w×h image, red on its left half and blue on its right, with
// alpha a.
func halves(w, h int, a uint8) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			c := color.NRGBA{R: 255, A: a}
			if x >= w/2 {
				c = color.NRGBA{B: 255, A: a}
			}
			img.SetNRGBA(x, y, c)
		}
	}
	return img
}

func encode(t testing.TB, format string, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	var err error
	switch format {
	case "png":
		err = png.Encode(&b, img)
	case "jpeg":
		err = jpeg.Encode(&b, img, &jpeg.Options{Quality: 90})
	case "gif":
		err = gif.Encode(&b, img, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chunk is a PNG chunk with its CRC.
func chunk(typ string, data []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
	b = append(b, typ...)
	b = append(b, data...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(append([]byte(typ), data...)))
}

// pngHeader is a PNG signature and an IHDR chunk of an 8-bit RGBA image
// of w×h, then (what a bomb carries) a small IDAT and IEND.
func pngHeader(w, h uint32) []byte {
	ihdr := binary.BigEndian.AppendUint32(nil, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 6, 0, 0, 0) // depth 8, RGBA, deflate, filter 0, no interlace
	b := append([]byte("\x89PNG\r\n\x1a\n"), chunk("IHDR", ihdr)...)
	// A zlib stream of a few zero bytes: what would inflate to the
	// claimed size in a real bomb.
	b = append(b, chunk("IDAT", []byte{0x78, 0x9c, 0x63, 0x60, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01})...)
	return append(b, chunk("IEND", nil)...)
}

func TestProbe(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		want Config
	}{
		{"png", encode(t, "png", halves(30, 20, 255)), Config{"png", 30, 20}},
		{"jpeg", encode(t, "jpeg", halves(17, 5, 255)), Config{"jpeg", 17, 5}},
		{"gif", encode(t, "gif", halves(1, 300, 255)), Config{"gif", 1, 300}},
		{"webp lossy", readFile(t, "blue-purple-pink.lossy.webp"), Config{"webp", 150, 100}},
		{"webp lossless", readFile(t, "gopher-doc.with-alpha.lossless.webp"), Config{"webp", 75, 100}},
		{"bomb", pngHeader(100000, 100000), Config{"png", 100000, 100000}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Probe(bytes.NewReader(tc.b))
			if err != nil || got != tc.want {
				t.Fatalf("Probe = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// errAfter fails every read: what follows a header Probe must not need.
type errAfter struct{}

func (errAfter) Read([]byte) (int, error) { return 0, errors.New("read past the header") }

// TestProbeReadsHeaderOnly: the bytes after the header are never read.
func TestProbeReadsHeaderOnly(t *testing.T) {
	b := encode(t, "png", halves(64, 48, 255))
	head := b[:8+8+13+4] // signature, IHDR
	got, err := Probe(io.MultiReader(bytes.NewReader(head), errAfter{}))
	if err != nil || got != (Config{"png", 64, 48}) {
		t.Fatalf("Probe of a header followed by a failing reader = %+v, %v", got, err)
	}
}

func TestUnsupported(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty": nil,
		"text":  []byte("hello, world"),
		"svg":   []byte(`<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>`),
		"bmp":   append([]byte("BM"), make([]byte, 60)...),
		"html":  []byte("<!doctype html><script>alert(1)</script>"),
	} {
		if c, err := Probe(bytes.NewReader(b)); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Probe(%s) = %+v, %v; want ErrUnsupported", name, c, err)
		}
		if _, _, _, err := Make(bytes.NewReader(b), 1<<20, 64); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Make(%s): %v; want ErrUnsupported", name, err)
		}
	}
	// A known format cut short is an error, not a format this package
	// does not take.
	b := encode(t, "png", halves(8, 8, 255))
	if _, err := Probe(bytes.NewReader(b[:20])); err == nil || errors.Is(err, ErrUnsupported) {
		t.Errorf("Probe(truncated png header): %v; want a decode error", err)
	}
	if _, _, _, err := Make(bytes.NewReader(b[:len(b)-20]), 1<<20, 64); err == nil || errors.Is(err, ErrUnsupported) {
		t.Errorf("Make(truncated png): %v; want a decode error", err)
	}
}

// decodeThumb decodes a thumbnail Make returned and checks its size.
func decodeThumb(t *testing.T, jpg []byte, w, h int) image.Image {
	t.Helper()
	img, format, err := image.Decode(bytes.NewReader(jpg))
	if err != nil || format != "jpeg" {
		t.Fatalf("thumbnail: %s, %v; want a JPEG", format, err)
	}
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("thumbnail is %dx%d, Make said %dx%d", b.Dx(), b.Dy(), w, h)
	}
	return img
}

// near reports whether c is within 40 of r, g, b on each channel.
func near(c color.Color, r, g, b int) bool {
	cr, cg, cb, _ := c.RGBA()
	d := func(x uint32, y int) bool { v := int(x>>8) - y; return v > -40 && v < 40 }
	return d(cr, r) && d(cg, g) && d(cb, b)
}

func TestMake(t *testing.T) {
	tests := []struct {
		name         string
		b            []byte
		side         int
		w, h         int
		left, right  [3]int // colours at the middle of the left and right quarters
		checkColours bool
	}{
		{"png down", encode(t, "png", halves(960, 640, 255)), 320, 320, 213, [3]int{255, 0, 0}, [3]int{0, 0, 255}, true},
		{"jpeg tall", encode(t, "jpeg", halves(300, 1000, 255)), 320, 96, 320, [3]int{255, 0, 0}, [3]int{0, 0, 255}, true},
		{"gif", encode(t, "gif", halves(480, 480, 255)), 320, 320, 320, [3]int{255, 0, 0}, [3]int{0, 0, 255}, true},
		{"small keeps its size", encode(t, "png", halves(100, 50, 255)), 320, 100, 50, [3]int{255, 0, 0}, [3]int{0, 0, 255}, true},
		{"transparent is white", encode(t, "png", halves(150, 150, 0)), 100, 100, 100, [3]int{255, 255, 255}, [3]int{255, 255, 255}, true},
		{"thin", encode(t, "png", halves(3000, 2, 255)), 320, 320, 1, [3]int{}, [3]int{}, false},
		{"jpeg box filtered", encode(t, "jpeg", halves(1400, 1050, 255)), 320, 320, 240, [3]int{255, 0, 0}, [3]int{0, 0, 255}, true},
		{"png box filtered", encode(t, "png", halves(850, 800, 255)), 100, 100, 94, [3]int{255, 0, 0}, [3]int{0, 0, 255}, true},
		{"transparent box filtered", encode(t, "png", halves(800, 800, 0)), 100, 100, 100, [3]int{255, 255, 255}, [3]int{255, 255, 255}, true},
		{"webp lossy", readFile(t, "blue-purple-pink.lossy.webp"), 64, 64, 43, [3]int{}, [3]int{}, false},
		{"webp lossless with alpha", readFile(t, "gopher-doc.with-alpha.lossless.webp"), 50, 38, 50, [3]int{}, [3]int{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			jpg, w, h, err := Make(bytes.NewReader(tc.b), 50_000_000, tc.side)
			if err != nil || w != tc.w || h != tc.h {
				t.Fatalf("Make = %dx%d, %v; want %dx%d", w, h, err, tc.w, tc.h)
			}
			img := decodeThumb(t, jpg, w, h)
			if !tc.checkColours {
				return
			}
			l, r := img.At(w/4, h/2), img.At(3*w/4, h/2)
			if !near(l, tc.left[0], tc.left[1], tc.left[2]) || !near(r, tc.right[0], tc.right[1], tc.right[2]) {
				t.Errorf("colours left %v right %v, want about %v and %v", l, r, tc.left, tc.right)
			}
		})
	}
}

// TestMakeGIFFrame: a GIF whose first frame covers part of its screen is
// drawn where it lies, the rest transparent (white).
func TestMakeGIFFrame(t *testing.T) {
	frame := image.NewPaletted(image.Rect(50, 0, 100, 100), color.Palette{color.Transparent, color.RGBA{0, 0, 255, 255}})
	for y := range 100 {
		for x := 50; x < 100; x++ {
			frame.SetColorIndex(x, y, 1)
		}
	}
	var b bytes.Buffer
	if err := gif.EncodeAll(&b, &gif.GIF{Image: []*image.Paletted{frame}, Delay: []int{0},
		Config: image.Config{ColorModel: frame.Palette, Width: 100, Height: 100}}); err != nil {
		t.Fatal(err)
	}
	jpg, w, h, err := Make(&b, 1<<20, 50)
	if err != nil || w != 50 || h != 50 {
		t.Fatalf("Make = %dx%d, %v; want 50x50", w, h, err)
	}
	img := decodeThumb(t, jpg, w, h)
	if l, r := img.At(10, 25), img.At(40, 25); !near(l, 255, 255, 255) || !near(r, 0, 0, 255) {
		t.Errorf("left %v right %v, want white and blue", l, r)
	}
}

func TestMakePixelLimit(t *testing.T) {
	b := encode(t, "png", halves(100, 60, 255))
	if _, _, _, err := Make(bytes.NewReader(b), 6000, 32); err != nil {
		t.Errorf("Make at exactly the limit: %v", err)
	}
	if _, _, _, err := Make(bytes.NewReader(b), 5999, 32); !errors.Is(err, ErrTooManyPixels) {
		t.Errorf("Make one pixel over: %v, want ErrTooManyPixels", err)
	}
	if _, _, _, err := Make(bytes.NewReader(b), 1<<20, 0); err == nil {
		t.Error("Make with a longest side of 0: no error")
	}
}

// TestMakeBomb: a PNG of a few dozen bytes claiming 100,000 × 100,000
// pixels (40 GB decoded) is refused from its header, without allocating
// for it.
func TestMakeBomb(t *testing.T) {
	bomb := pngHeader(100000, 100000)
	if _, _, _, err := Make(bytes.NewReader(bomb), 50_000_000, 320); !errors.Is(err, ErrTooManyPixels) {
		t.Fatalf("Make(bomb): %v, want ErrTooManyPixels", err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		_, _, _, _ = Make(bytes.NewReader(bomb), 50_000_000, 320)
	})
	if allocs > 50 {
		t.Errorf("Make(bomb) made %.0f allocations, want a header's worth (≤ 50)", allocs)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 10 {
		_, _, _, _ = Make(bytes.NewReader(bomb), 50_000_000, 320)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("10 refusals of the bomb allocated %d bytes, want under 1 MiB", got)
	}
	// WebP's lossless header: 16384 × 16384 in 14-bit fields.
	vp8l := []byte{0x2f, 0xff, 0xff, 0xff, 0x0f, 0x00} // version 0, no alpha
	riff := append([]byte("RIFF"), binary.LittleEndian.AppendUint32(nil, uint32(4+8+len(vp8l)))...)
	riff = append(riff, "WEBPVP8L"...)
	riff = binary.LittleEndian.AppendUint32(riff, uint32(len(vp8l)))
	riff = append(riff, vp8l...)
	if c, err := Probe(bytes.NewReader(riff)); err != nil || c != (Config{"webp", 16384, 16384}) {
		t.Fatalf("Probe(webp bomb) = %+v, %v", c, err)
	}
	if _, _, _, err := Make(bytes.NewReader(riff), 50_000_000, 320); !errors.Is(err, ErrTooManyPixels) {
		t.Fatalf("Make(webp bomb): %v, want ErrTooManyPixels", err)
	}
}

// TestShrinkYCbCr: the plane averages of every subsampling agree with
// averaging the converted pixels, within rounding.
func TestShrinkYCbCr(t *testing.T) {
	ratios := []image.YCbCrSubsampleRatio{image.YCbCrSubsampleRatio444, image.YCbCrSubsampleRatio422,
		image.YCbCrSubsampleRatio420, image.YCbCrSubsampleRatio440, image.YCbCrSubsampleRatio411, image.YCbCrSubsampleRatio410}
	seed := uint32(1)
	next := func() uint8 { seed = seed*1664525 + 1013904223; return uint8(seed >> 24) }
	for _, ratio := range ratios {
		// An odd origin and size: partial blocks and chroma offsets.
		src := image.NewYCbCr(image.Rect(3, 5, 3+37, 5+29), ratio)
		for i := range src.Y {
			src.Y[i] = 64 + next()/2 // no clamping in the conversion
		}
		for i := range src.Cb {
			src.Cb[i], src.Cr[i] = 128+next()/8, 128-next()/8 // mild chroma: no clamping
		}
		const k = 4
		got := shrink(src, k)
		b := src.Bounds()
		for dy := range got.Rect.Dy() {
			for dx := range got.Rect.Dx() {
				var sr, sg, sb, n int
				for y := b.Min.Y + dy*k; y < min(b.Min.Y+dy*k+k, b.Max.Y); y++ {
					for x := b.Min.X + dx*k; x < min(b.Min.X+dx*k+k, b.Max.X); x++ {
						c := src.YCbCrAt(x, y)
						r, g, bl := color.YCbCrToRGB(c.Y, c.Cb, c.Cr)
						sr, sg, sb, n = sr+int(r), sg+int(g), sb+int(bl), n+1
					}
				}
				want := [3]int{sr / n, sg / n, sb / n}
				p := got.RGBAAt(dx, dy)
				for i, v := range []uint8{p.R, p.G, p.B} {
					if d := int(v) - want[i]; d < -3 || d > 3 {
						t.Fatalf("%v: pixel (%d,%d) = %v, want about %v", ratio, dx, dy, p, want)
					}
				}
			}
		}
	}
}

func TestFit(t *testing.T) {
	for _, tc := range []struct{ w, h, side, ww, wh int }{
		{1200, 800, 320, 320, 213},
		{800, 1200, 320, 213, 320},
		{320, 320, 320, 320, 320},
		{10000, 1, 320, 320, 1},
		{1, 1, 320, 1, 1},
		{1 << 30, 1 << 30, 4096, 4096, 4096},
	} {
		if w, h := fit(tc.w, tc.h, tc.side); w != tc.ww || h != tc.wh {
			t.Errorf("fit(%d, %d, %d) = %d, %d; want %d, %d", tc.w, tc.h, tc.side, w, h, tc.ww, tc.wh)
		}
	}
}

func BenchmarkMake(b *testing.B) {
	for _, size := range []struct{ w, h int }{{1200, 800}, {4000, 3000}} {
		src := encode(b, "jpeg", halves(size.w, size.h, 255))
		b.Run(image.Pt(size.w, size.h).String(), func(b *testing.B) {
			for b.Loop() {
				if _, _, _, err := Make(bytes.NewReader(src), 50_000_000, 320); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
