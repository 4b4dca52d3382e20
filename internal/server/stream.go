package server

import "strings"

// streamedRoute is a route whose request bodies are streamed to the
// handler (uploads): on the event loop, a request with a Content-Length
// reaches its handler as soon as its head is in, its body read under TCP
// flow control instead of buffered whole, and bounded by limit instead of
// limits.max_frame_bytes (nbhttp.Config.StreamBody). net/http, which
// serves race builds, streams every body.
type streamedRoute struct {
	method, prefix string
	limit          int64
}

// streamRoute makes method requests to paths under prefix streamed, up to
// limit bytes of body. Routes are added before the node listens.
func (s *Server) streamRoute(method, prefix string, limit int64) {
	s.streamed = append(s.streamed, streamedRoute{method: method, prefix: prefix, limit: limit})
}

// streamsBody is the event loop's StreamBody.
func (s *Server) streamsBody(method, path string) (int64, bool) {
	for _, r := range s.streamed {
		if r.method == method && strings.HasPrefix(path, r.prefix) {
			return r.limit, true
		}
	}
	return 0, false
}
