package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/kt"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// ktOpenTimeout bounds loading the key transparency log at start (its
// keys, and every leaf to rebuild the tree: about 100 reads per 100,000
// leaves).
const ktOpenTimeout = 2 * time.Minute

// openKT opens the key transparency log on the chat store (nil when
// kt.enabled is off).
func (s *Server) openKT(st store.Store) (*kt.Log, error) {
	if !s.cfg.KT.Enabled {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ktOpenTimeout)
	defer cancel()
	l, err := kt.Open(ctx, s.cfg.KTOrigin(), kt.Deps{Store: st, Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return l, nil
}

// routeKT serves the key transparency log to outside auditors: public
// GETs, no token, limited per source address (kt.http_rate, http_burst),
// answered through the backend so a gateway-only node asks the chat tier
// (docs/protocol.md, "HTTP endpoints").
func (s *Server) routeKT(mux *http.ServeMux) {
	lim := newSourceLimiter(rate.Limit(s.cfg.KT.HTTPRate), s.cfg.KT.HTTPBurst, s.now)
	handle := func(path string, build func(q map[string][]string) (*protocol.Frame, *protocol.Error), answer func(*protocol.Frame) any) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Access-Control-Allow-Origin", "*")
			if ok, wait := lim.allow(r.RemoteAddr); !ok {
				w.Header().Set("Retry-After", strconv.FormatInt(int64(wait/time.Second)+1, 10))
				writeError(w, &protocol.Error{Code: protocol.CodeRateLimited, Msg: "too many key transparency requests from this address", RetryAfter: wait.Milliseconds() + 1})
				return
			}
			f, perr := build(r.URL.Query())
			if perr == nil {
				perr = protocol.Validate(f, s.cfg.Limits)
			}
			if perr != nil {
				writeError(w, perr)
				return
			}
			var resp *protocol.Frame
			s.backend.Handle(r.Context(), chat.Caller{}, f, func(f *protocol.Frame) { resp = f })
			switch {
			case resp == nil:
				writeError(w, protocol.Errorf(protocol.CodeInternal, "no answer"))
				return
			case resp.Type == protocol.TypeError:
				if resp.RetryAfter > 0 {
					w.Header().Set("Retry-After", strconv.FormatInt((resp.RetryAfter+999)/1000, 10))
				}
				writeError(w, &protocol.Error{Code: resp.Code, Msg: resp.Error, RetryAfter: resp.RetryAfter})
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			_ = json.NewEncoder(w).Encode(answer(resp))
		})
	}
	kind := func(resp *protocol.Frame) any { return resp.KT }
	handle("/v1/kt/keys", func(map[string][]string) (*protocol.Frame, *protocol.Error) {
		return &protocol.Frame{Type: protocol.TypeKTKeys}, nil
	}, func(resp *protocol.Frame) any { return resp.KTKeys })
	handle("/v1/kt/checkpoint", func(map[string][]string) (*protocol.Frame, *protocol.Error) {
		return &protocol.Frame{Type: protocol.TypeKTLeaves, Limit: 1}, nil
	}, func(resp *protocol.Frame) any { return protocol.KTProof{Checkpoint: resp.KT.Checkpoint} })
	handle("/v1/kt/leaves", func(q map[string][]string) (*protocol.Frame, *protocol.Error) {
		from, perr := queryUint(q, "from", false)
		if perr != nil {
			return nil, perr
		}
		limit, perr := queryUint(q, "limit", false)
		if perr != nil {
			return nil, perr
		}
		if limit > protocol.MaxKTLeaves {
			return nil, protocol.Errorf(protocol.CodeInvalidArgument, "limit must be 0..%d", protocol.MaxKTLeaves)
		}
		return &protocol.Frame{Type: protocol.TypeKTLeaves, From: from, Limit: int(limit)}, nil
	}, kind)
	handle("/v1/kt/consistency", func(q map[string][]string) (*protocol.Frame, *protocol.Error) {
		from, perr := queryUint(q, "from", true)
		if perr != nil {
			return nil, perr
		}
		to, perr := queryUint(q, "to", true)
		if perr != nil {
			return nil, perr
		}
		return &protocol.Frame{Type: protocol.TypeKTConsistency, From: from, To: to}, nil
	}, kind)
}

// queryUint reads a decimal query parameter (absent: 0, or an error when
// required).
func queryUint(q map[string][]string, name string, required bool) (uint64, *protocol.Error) {
	v := q[name]
	if len(v) == 0 || v[0] == "" {
		if required {
			return 0, protocol.Errorf(protocol.CodeInvalidArgument, "%s is required", name)
		}
		return 0, nil
	}
	n, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil {
		return 0, protocol.Errorf(protocol.CodeInvalidArgument, "%s %q is not a decimal integer", name, v[0])
	}
	return n, nil
}

// sourceLimiter is a token bucket per source address, the idle ones
// dropped now and then so the map stays as small as the set of recent
// sources.
type sourceLimiter struct {
	every rate.Limit
	burst int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*sourceBucket
	swept   time.Time
}

type sourceBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// sourceIdle is how long an unused bucket is kept (a full one refills
// long before).
const sourceIdle = 10 * time.Minute

func newSourceLimiter(every rate.Limit, burst int, now func() time.Time) *sourceLimiter {
	return &sourceLimiter{every: every, burst: burst, now: now, buckets: map[string]*sourceBucket{}}
}

// allow takes a token for remote (host:port; the port is ignored) or says
// how long until one is there.
func (l *sourceLimiter) allow(remote string) (bool, time.Duration) {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > sourceIdle {
		for k, b := range l.buckets {
			if now.Sub(b.seen) > sourceIdle {
				delete(l.buckets, k)
			}
		}
		l.swept = now
	}
	b := l.buckets[host]
	if b == nil {
		b = &sourceBucket{lim: rate.NewLimiter(l.every, l.burst)}
		l.buckets[host] = b
	}
	b.seen = now
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}
