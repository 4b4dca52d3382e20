package e2eechat

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	_ "image/gif" // decoders for Thumbnail
	"image/jpeg"
	_ "image/png"
	"io"
)

// Thumbnails of E2E images are made on the sender's device (the server
// sees ciphertext only) and travel inside the encrypted content, so they
// are small: MaxThumbnailBytes of JPEG at most.
const (
	MaxThumbnailBytes = 8 << 10
	// thumbMaxPixels refuses decompression bombs: an image whose header
	// claims more pixels is not decoded.
	thumbMaxPixels = 50_000_000
)

// thumbSides are the longest sides tried, largest first, until the JPEG
// fits MaxThumbnailBytes.
var thumbSides = []int{160, 120, 96, 64, 48}

// ImageSize reads the width and height of an image (PNG, JPEG or GIF)
// from its header.
func ImageSize(r io.ReaderAt, size int64) (width, height int, err error) {
	cfg, _, err := image.DecodeConfig(io.NewSectionReader(r, 0, size))
	return cfg.Width, cfg.Height, err
}

// Thumbnail reads an image (PNG, JPEG or GIF) from r and returns a JPEG
// thumbnail of at most maxBytes (0: MaxThumbnailBytes). An image over 50
// million pixels (by its header) is refused undecoded.
func Thumbnail(r io.ReaderAt, size int64, maxBytes int) ([]byte, error) {
	if maxBytes <= 0 || maxBytes > MaxThumbnailBytes {
		maxBytes = MaxThumbnailBytes
	}
	w, h, err := ImageSize(r, size)
	if err != nil {
		return nil, err
	}
	if w <= 0 || h <= 0 || int64(w)*int64(h) > thumbMaxPixels {
		return nil, fmt.Errorf("e2eechat: thumbnail: %d×%d pixels is over the limit", w, h)
	}
	img, _, err := image.Decode(io.NewSectionReader(r, 0, size))
	if err != nil {
		return nil, err
	}
	for _, side := range thumbSides {
		small := shrink(img, side)
		for _, q := range []int{70, 50, 35} {
			var buf bytes.Buffer
			if err := jpeg.Encode(&buf, small, &jpeg.Options{Quality: q}); err != nil {
				return nil, err
			}
			if buf.Len() <= maxBytes {
				return buf.Bytes(), nil
			}
		}
	}
	return nil, fmt.Errorf("e2eechat: thumbnail: no JPEG under %d bytes", maxBytes)
}

// shrink scales img so that its longer side is at most side, averaging
// the source pixels each target pixel covers (a box filter: good enough
// for a preview, and only the standard library).
func shrink(img image.Image, side int) image.Image {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	tw, th := w, h
	if w >= h && w > side {
		tw, th = side, max(1, h*side/w)
	} else if h > w && h > side {
		tw, th = max(1, w*side/h), side
	}
	out := image.NewRGBA(image.Rect(0, 0, tw, th))
	for y := 0; y < th; y++ {
		y0, y1 := b.Min.Y+y*h/th, b.Min.Y+max((y+1)*h/th, y*h/th+1)
		for x := 0; x < tw; x++ {
			x0, x1 := b.Min.X+x*w/tw, b.Min.X+max((x+1)*w/tw, x*w/tw+1)
			var r, g, bl, a, n uint64
			for sy := y0; sy < y1; sy++ {
				for sx := x0; sx < x1; sx++ {
					cr, cg, cb, ca := img.At(sx, sy).RGBA()
					r, g, bl, a, n = r+uint64(cr), g+uint64(cg), bl+uint64(cb), a+uint64(ca), n+1
				}
			}
			// JPEG has no alpha: composite over white.
			av := a / n
			white := uint64(0xffff) - av
			out.Set(x, y, color.RGBA64{
				R: uint16(r/n + white), G: uint16(g/n + white), B: uint16(bl/n + white), A: 0xffff,
			})
		}
	}
	return out
}
