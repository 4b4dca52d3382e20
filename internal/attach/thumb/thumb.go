// Package thumb reads the dimensions of an image from its header (Probe)
// and makes a JPEG thumbnail of it (Make), for the images of plain
// conversations: PNG, JPEG, GIF (its first frame) and WebP.
//
// An image is untrusted input. Make reads the header first and refuses
// an image whose header claims more than maxPixels pixels before decoding
// anything (a decompression bomb — a few kilobytes that claim 100,000 ×
// 100,000 pixels — never gets its 40 GB allocated); the decoders then
// allocate for the dimensions of the header, which they hold the data to.
//
// Dimensions and thumbnails are as displayed: a JPEG's EXIF orientation
// (a camera's portrait photo stored sideways) is applied.
//
// The package is pure: no I/O but its reader, no state; safe for
// concurrent use.
package thumb

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"io"

	// The decoders of the formats Probe and Make take.
	_ "image/gif"
	_ "image/png"

	"golang.org/x/image/draw"
	_ "golang.org/x/image/webp"
)

// Errors of Probe and Make.
var (
	// ErrUnsupported: not an image of a format this package takes.
	ErrUnsupported = errors.New("thumb: unsupported image format")
	// ErrTooManyPixels: the header claims more pixels than allowed.
	ErrTooManyPixels = errors.New("thumb: image has too many pixels")
)

// Config is what an image's header says.
type Config struct {
	Format        string // "png", "jpeg", "gif" or "webp"
	Width, Height int
}

// Quality is the JPEG quality of thumbnails.
const Quality = 80

// formats are the formats taken; another package may register more
// decoders with package image, which Probe does not take.
var formats = map[string]bool{"png": true, "jpeg": true, "gif": true, "webp": true}

// Probe reads the header of the image r starts with. It reads only as
// far as the dimensions (and what buffering reads ahead). The dimensions
// are as displayed: a JPEG's EXIF orientation that turns it a quarter
// swaps them.
func Probe(r io.Reader) (Config, error) {
	cfg, _, err := header(r, nil)
	return cfg, err
}

// header reads the header of the image r starts with, keeping what it
// read in head (if not nil), and returns its Config (as displayed) and
// EXIF orientation (1 but for JPEG).
func header(r io.Reader, head *bytes.Buffer) (Config, int, error) {
	if head == nil {
		head = new(bytes.Buffer)
	}
	c, format, err := image.DecodeConfig(io.TeeReader(r, head))
	switch {
	case errors.Is(err, image.ErrFormat) || (err == nil && !formats[format]):
		return Config{}, 0, ErrUnsupported
	case err != nil:
		return Config{}, 0, fmt.Errorf("thumb: %s header: %w", format, err)
	case c.Width <= 0 || c.Height <= 0:
		return Config{}, 0, fmt.Errorf("thumb: %s header: %dx%d pixels", format, c.Width, c.Height)
	}
	cfg, o := Config{Format: format, Width: c.Width, Height: c.Height}, 1
	if format == "jpeg" {
		o = orientation(head.Bytes())
	}
	if swaps(o) {
		cfg.Width, cfg.Height = cfg.Height, cfg.Width
	}
	return cfg, o, nil
}

// Make decodes the image r holds and returns it as a JPEG scaled down so
// that its longest side is at most maxSide (a smaller image keeps its
// size) and turned as its EXIF orientation says (JPEG), with its width
// and height. Transparent pixels come out white.
// An image whose header claims more than maxPixels pixels is refused
// with ErrTooManyPixels before it is decoded; one of another format with
// ErrUnsupported.
func Make(r io.Reader, maxPixels int64, maxSide int) (jpg []byte, width, height int, err error) {
	if maxSide < 1 {
		return nil, 0, 0, fmt.Errorf("thumb: longest side %d", maxSide)
	}
	// The header is read through a copy, so that the decoder reads it
	// again followed by the rest.
	var head bytes.Buffer
	cfg, o, err := header(r, &head)
	if err != nil {
		return nil, 0, 0, err
	}
	if swaps(o) {
		cfg.Width, cfg.Height = cfg.Height, cfg.Width // as stored, until turned
	}
	if int64(cfg.Width) > maxPixels/int64(cfg.Height) {
		return nil, 0, 0, fmt.Errorf("%w: %dx%d, at most %d", ErrTooManyPixels, cfg.Width, cfg.Height, maxPixels)
	}
	src, _, err := image.Decode(io.MultiReader(&head, r))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("thumb: decode %s: %w", cfg.Format, err)
	}
	full := image.Rect(0, 0, cfg.Width, cfg.Height)
	if b := src.Bounds(); b != full {
		// A GIF's first frame may cover part of its screen only.
		if !b.In(full) {
			return nil, 0, 0, fmt.Errorf("thumb: decode %s: bounds %v outside the header's %dx%d", cfg.Format, b, cfg.Width, cfg.Height)
		}
		canvas := image.NewRGBA(full)
		draw.Draw(canvas, b, src, b.Min, draw.Src)
		src = canvas
	}
	width, height = fit(cfg.Width, cfg.Height, maxSide)
	dst := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(dst, dst.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	if width == cfg.Width && height == cfg.Height {
		draw.Draw(dst, dst.Bounds(), src, image.Point{}, draw.Over) // same size: a copy
	} else {
		// Much larger than the thumbnail: a box filter down to about
		// twice its size first, then the kernel.
		sr := full
		if k := max(cfg.Width, cfg.Height) / (2 * maxSide); k >= 2 {
			if small := shrink(src, k); small != nil {
				src, sr = small, small.Bounds()
			}
		}
		draw.CatmullRom.Scale(dst, dst.Bounds(), src, sr, draw.Over, nil)
	}
	dst = orient(dst, o)
	var out bytes.Buffer
	if err := jpeg.Encode(&out, dst, &jpeg.Options{Quality: Quality}); err != nil {
		return nil, 0, 0, fmt.Errorf("thumb: encode: %w", err)
	}
	return out.Bytes(), dst.Rect.Dx(), dst.Rect.Dy(), nil
}

// fit scales w×h down to a longest side of at most side, keeping the
// aspect ratio (rounded, at least 1 pixel).
func fit(w, h, side int) (int, int) {
	long := max(w, h)
	if long <= side {
		return w, h
	}
	scale := func(v int) int { return max(1, int((int64(v)*int64(side)+int64(long)/2)/int64(long))) }
	return scale(w), scale(h)
}
