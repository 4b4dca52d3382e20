package blob

import "fmt"

// CheckParts reports, as ErrBadParts, why parts (given to Complete) are
// not a prefix 1..k of have (the parts the engine holds): a number out of
// sequence, a part missing, a size or tag that differs, a part other than
// the last smaller than MinPartSize. Engines call it before they join.
func CheckParts(parts, have []Part) error {
	if len(parts) == 0 {
		return fmt.Errorf("%w: no parts", ErrBadParts)
	}
	if len(parts) > MaxParts {
		return fmt.Errorf("%w: %d parts, more than %d", ErrBadParts, len(parts), MaxParts)
	}
	held := make(map[int]Part, len(have))
	for _, p := range have {
		held[p.N] = p
	}
	for i, p := range parts {
		if p.N != i+1 {
			return fmt.Errorf("%w: part %d given as number %d", ErrBadParts, i+1, p.N)
		}
		h, ok := held[p.N]
		switch {
		case !ok:
			return fmt.Errorf("%w: part %d was not received", ErrBadParts, p.N)
		case h.Size != p.Size || h.ETag != p.ETag:
			return fmt.Errorf("%w: part %d is %d bytes tagged %q, not %d bytes tagged %q", ErrBadParts, p.N, h.Size, h.ETag, p.Size, p.ETag)
		case i < len(parts)-1 && p.Size < MinPartSize:
			return fmt.Errorf("%w: part %d has %d bytes, fewer than %d before the last part", ErrBadParts, p.N, p.Size, MinPartSize)
		}
	}
	return nil
}
