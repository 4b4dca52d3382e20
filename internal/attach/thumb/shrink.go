package thumb

import (
	"image"
	"image/color"
)

// shrink averages src over k×k blocks (a box filter; partial blocks at
// the right and bottom edges average what they have), for the formats
// decoders return most: a big photo reduced this way to about twice the
// thumbnail's size costs one pass over its pixels, where the scaler's
// kernel, stretched by the whole ratio, costs several. It returns nil
// for an image of another type (the scaler then takes it whole).
func shrink(src image.Image, k int) *image.RGBA {
	b := src.Bounds()
	w, h := (b.Dx()+k-1)/k, (b.Dy()+k-1)/k
	switch s := src.(type) {
	case *image.YCbCr:
		return shrinkYCbCr(s, k, w, h)
	case *image.NRGBA:
		dst := image.NewRGBA(image.Rect(0, 0, w, h))
		box(dst, b, k, func(x, y int) (r, g, b, a uint32) {
			p := s.Pix[s.PixOffset(x, y):]
			a = uint32(p[3])
			return uint32(p[0]) * a / 255, uint32(p[1]) * a / 255, uint32(p[2]) * a / 255, a
		})
		return dst
	case *image.RGBA:
		dst := image.NewRGBA(image.Rect(0, 0, w, h))
		box(dst, b, k, func(x, y int) (r, g, b, a uint32) {
			p := s.Pix[s.PixOffset(x, y):]
			return uint32(p[0]), uint32(p[1]), uint32(p[2]), uint32(p[3])
		})
		return dst
	}
	return nil
}

// box fills dst with the averages of at's premultiplied 8-bit values over
// the k×k blocks of sb.
func box(dst *image.RGBA, sb image.Rectangle, k int, at func(x, y int) (r, g, b, a uint32)) {
	for dy := range dst.Rect.Dy() {
		y0 := sb.Min.Y + dy*k
		y1 := min(y0+k, sb.Max.Y)
		for dx := range dst.Rect.Dx() {
			x0 := sb.Min.X + dx*k
			x1 := min(x0+k, sb.Max.X)
			var r, g, b, a uint32
			for y := y0; y < y1; y++ {
				for x := x0; x < x1; x++ {
					pr, pg, pb, pa := at(x, y)
					r, g, b, a = r+pr, g+pg, b+pb, a+pa
				}
			}
			n := uint32((y1 - y0) * (x1 - x0))
			p := dst.Pix[dst.PixOffset(dx, dy):]
			p[0], p[1], p[2], p[3] = uint8((r+n/2)/n), uint8((g+n/2)/n), uint8((b+n/2)/n), uint8((a+n/2)/n)
		}
	}
}

// shrinkYCbCr is shrink of a YCbCr image: the planes are averaged, then
// each average converted (the conversion is affine, so this equals
// averaging the converted pixels but for rounding).
func shrinkYCbCr(s *image.YCbCr, k, w, h int) *image.RGBA {
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	hs, vs := 1, 1 // chroma subsampling, horizontal and vertical
	switch s.SubsampleRatio {
	case image.YCbCrSubsampleRatio422:
		hs = 2
	case image.YCbCrSubsampleRatio420:
		hs, vs = 2, 2
	case image.YCbCrSubsampleRatio440:
		vs = 2
	case image.YCbCrSubsampleRatio411:
		hs = 4
	case image.YCbCrSubsampleRatio410:
		hs, vs = 4, 2
	}
	r := s.Rect
	cx0, cy0 := r.Min.X/hs, r.Min.Y/vs
	for dy := range h {
		y0 := r.Min.Y + dy*k
		y1 := min(y0+k, r.Max.Y)
		for dx := range w {
			x0 := r.Min.X + dx*k
			x1 := min(x0+k, r.Max.X)
			var ys, cbs, crs uint32
			for y := y0; y < y1; y++ {
				yrow := s.Y[(y-r.Min.Y)*s.YStride:]
				crow := (y/vs - cy0) * s.CStride
				for x := x0; x < x1; x++ {
					ys += uint32(yrow[x-r.Min.X])
					ci := crow + x/hs - cx0
					cbs += uint32(s.Cb[ci])
					crs += uint32(s.Cr[ci])
				}
			}
			n := uint32((y1 - y0) * (x1 - x0))
			cr, cg, cb := color.YCbCrToRGB(uint8((ys+n/2)/n), uint8((cbs+n/2)/n), uint8((crs+n/2)/n))
			p := dst.Pix[dst.PixOffset(dx, dy):]
			p[0], p[1], p[2], p[3] = cr, cg, cb, 255
		}
	}
	return dst
}
