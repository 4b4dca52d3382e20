package thumb

import (
	"encoding/binary"
	"image"
)

// EXIF orientation (TIFF tag 0x0112) of a JPEG: how the stored pixels are
// turned for display. Cameras store a portrait photo as a landscape one
// with orientation 6 or 8; the thumbnail and the dimensions are given as
// displayed.

// orientation reads the orientation from the APP1 Exif segment of the
// JPEG b starts with (the bytes up to its frame header suffice); 1 (as
// stored) when there is none or it cannot be read.
func orientation(b []byte) int {
	if len(b) < 4 || b[0] != 0xff || b[1] != 0xd8 {
		return 1
	}
	b = b[2:]
	for len(b) >= 4 && b[0] == 0xff {
		if b[1] == 0xff {
			b = b[1:] // a fill byte
			continue
		}
		marker, n := b[1], int(binary.BigEndian.Uint16(b[2:]))
		if n < 2 || marker == 0xda || (marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc) {
			return 1 // the image data or its frame: no Exif before it
		}
		if len(b) < 2+n {
			return 1
		}
		if seg := b[4 : 2+n]; marker == 0xe1 && len(seg) >= 6 && string(seg[:6]) == "Exif\x00\x00" {
			return tiffOrientation(seg[6:])
		}
		b = b[2+n:]
	}
	return 1
}

// tiffOrientation reads tag 0x0112 of IFD0 of the TIFF structure t.
func tiffOrientation(t []byte) int {
	if len(t) < 8 {
		return 1
	}
	var bo binary.ByteOrder
	switch string(t[:4]) {
	case "II*\x00":
		bo = binary.LittleEndian
	case "MM\x00*":
		bo = binary.BigEndian
	default:
		return 1
	}
	off := uint64(bo.Uint32(t[4:]))
	if off+2 > uint64(len(t)) {
		return 1
	}
	n := uint64(bo.Uint16(t[off:]))
	for i := range n {
		e := off + 2 + 12*i
		if e+12 > uint64(len(t)) {
			return 1
		}
		// An orientation is a SHORT (type 3) of count 1.
		if bo.Uint16(t[e:]) == 0x0112 && bo.Uint16(t[e+2:]) == 3 && bo.Uint32(t[e+4:]) == 1 {
			if v := int(bo.Uint16(t[e+8:])); v >= 1 && v <= 8 {
				return v
			}
			return 1
		}
	}
	return 1
}

// swaps reports whether orientation o turns the image a quarter (the
// displayed width is the stored height).
func swaps(o int) bool { return o >= 5 }

// orient returns src turned for display as orientation o says.
func orient(src *image.RGBA, o int) *image.RGBA {
	if o <= 1 || o > 8 {
		return src
	}
	w, h := src.Rect.Dx(), src.Rect.Dy()
	dw, dh := w, h
	if swaps(o) {
		dw, dh = h, w
	}
	dst := image.NewRGBA(image.Rect(0, 0, dw, dh))
	for y := range dh {
		for x := range dw {
			var sx, sy int
			switch o {
			case 2: // mirrored
				sx, sy = w-1-x, y
			case 3: // upside down
				sx, sy = w-1-x, h-1-y
			case 4: // mirrored upside down
				sx, sy = x, h-1-y
			case 5: // transposed
				sx, sy = y, x
			case 6: // a quarter clockwise to display
				sx, sy = y, h-1-x
			case 7: // transversed
				sx, sy = w-1-y, h-1-x
			case 8: // a quarter counterclockwise to display
				sx, sy = w-1-y, x
			}
			copy(dst.Pix[dst.PixOffset(x, y):][:4], src.Pix[src.PixOffset(sx, sy):][:4])
		}
	}
	return dst
}
