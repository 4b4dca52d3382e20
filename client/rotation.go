package client

// rotation hands out a cluster's gateway URLs in a fixed cyclic order from
// a random start. Random starts spread a population of clients evenly over
// the gateways; moving on at every attempt means a gateway that just
// drained, refused or dropped the client is the last one it returns to.
// Not safe for concurrent use: only Run's goroutine calls next.
type rotation struct {
	urls []string
	i    int
}

// newRotation copies urls (the caller may reuse its slice) and starts at
// intn(len(urls)).
func newRotation(urls []string, intn func(int) int) rotation {
	r := rotation{urls: append([]string(nil), urls...)}
	if len(r.urls) > 1 {
		r.i = intn(len(r.urls))
	}
	return r
}

// next returns the URL for the next connection attempt.
func (r *rotation) next() string {
	u := r.urls[r.i]
	r.i = (r.i + 1) % len(r.urls)
	return u
}

// peek returns the URL next will return, without moving on.
func (r *rotation) peek() string { return r.urls[r.i] }
