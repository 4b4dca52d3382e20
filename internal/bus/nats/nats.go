// Package nats carries the cluster's node-to-node traffic on NATS: the push
// bus (Bus, a bus.Bus on core NATS), the connection every NATS user of a
// process shares (Connect) and the naming rule of subject tokens that are
// also durable consumer names (ValidName). The durable queues on JetStream
// live with their users (internal/ledger/jetstream, the webhooks' engine).
//
// # Bus delivery guarantees
//
// Each gateway node subscribes to the subject <Subject>.<node> and receives
// one message per Delivery, carrying all its local recipients. Publish
// is a request: the subscriber answers once its handler has taken the
// delivery, and NATS answers at once with "no responders" when nobody
// subscribes, which Publish reports as bus.ErrNoSubscriber. Core NATS keeps
// nothing, so a push is delivered at most once: a delivery in flight when a
// gateway or the server fails is lost, and Publish then returns an error
// (no ack within AckTimeout, or not connected). That is by design: the
// message is already stored, and the client's gap fill and sync fetch it.
// A timeout does not prove the delivery was lost (the ack may be); clients
// drop duplicate pushes by seq.
//
// Bus is safe for concurrent use. A Bus handler runs on the
// subscription's goroutine, one delivery at a time per node, under a Gate:
// the subscription's cancel waits for the running handler, and none starts
// after it (a late delivery is answered as if nobody subscribed).
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/bus"
)

// ErrDisconnected means the client is not connected to NATS right now (it
// keeps reconnecting in the background).
var ErrDisconnected = errors.New("nats: not connected")

// ErrNoAck means the node's subscriber did not confirm a delivery in time.
var ErrNoAck = errors.New("nats: delivery not acknowledged")

// ErrRejected means the node's subscriber could not decode a delivery.
var ErrRejected = errors.New("nats: delivery rejected")

// ConnConfig configures Connect.
type ConnConfig struct {
	// URL of one or more servers, comma-separated. Required.
	URL string
	// Name identifies the client in the server's monitoring. Default "parley".
	Name string
	// ReconnectWait is the pause between reconnect attempts, which go on
	// forever. Default 250ms.
	ReconnectWait time.Duration
	// Logger receives connection events. Default discards.
	Logger *slog.Logger
}

// Validate reports a configuration Connect cannot use.
func (c *ConnConfig) Validate() error {
	if c.URL == "" {
		return errors.New("nats: conn config: URL is required")
	}
	if c.ReconnectWait < 0 {
		return errors.New("nats: conn config: negative ReconnectWait")
	}
	return nil
}

// Connect dials NATS with the options cluster mode relies on: reconnect
// forever, and resubscribe after a reconnect (core NATS does that itself).
// The dial is bounded by ctx's deadline, or 5s. The caller closes the conn.
func Connect(ctx context.Context, cfg ConnConfig) (*natsio.Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" {
		cfg.Name = "parley"
	}
	if cfg.ReconnectWait == 0 {
		cfg.ReconnectWait = 250 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("nats: connect: %w", err)
	}
	nc, err := natsio.Connect(cfg.URL,
		natsio.Name(cfg.Name),
		natsio.Timeout(timeout),
		natsio.MaxReconnects(-1),
		natsio.ReconnectWait(cfg.ReconnectWait),
		natsio.ReconnectJitter(cfg.ReconnectWait/2, time.Second),
		natsio.DisconnectErrHandler(func(_ *natsio.Conn, err error) {
			if err == nil {
				// Close, not a lost connection: a clean shutdown.
				log.Debug("nats connection closed")
				return
			}
			log.Warn("nats disconnected", "err", err)
		}),
		natsio.ReconnectHandler(func(c *natsio.Conn) {
			log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
		natsio.ErrorHandler(func(_ *natsio.Conn, s *natsio.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", err)
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("nats: connect: %w", err)
	}
	return nc, nil
}

// Config tunes the bus.
type Config struct {
	// Subject prefixes the per-node subjects. Default "parley.node".
	Subject string
	// AckTimeout bounds how long Publish waits for the node's ack.
	// Default 2s.
	AckTimeout time.Duration
	// Logger receives undecodable deliveries (at most one line a second).
	// Default discards.
	Logger *slog.Logger
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Subject == "" {
		out.Subject = "parley.node"
	}
	if out.AckTimeout == 0 {
		out.AckTimeout = 2 * time.Second
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Validate reports a configuration the bus cannot use.
func (c *Config) Validate() error {
	d := c.withDefaults()
	if d.AckTimeout < 0 {
		return errors.New("nats: config: negative AckTimeout")
	}
	for _, tok := range strings.Split(d.Subject, ".") {
		if !validToken(tok) {
			return fmt.Errorf("nats: config: bad subject prefix %q", d.Subject)
		}
	}
	return nil
}

// validToken reports whether s can be one token of a subject: not empty,
// no separator, wildcard or whitespace.
func validToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".*> \t\r\n")
}

// Bus is a bus.Bus on core NATS.
type Bus struct {
	nc      *natsio.Conn
	cfg     Config
	lastLog atomic.Int64 // unix ns of the last rate-limited log line
}

var _ bus.Bus = (*Bus)(nil)

// New returns a bus on nc (see Connect); the caller owns nc and closes it
// after the bus's last use.
func New(nc *natsio.Conn, cfg Config) (*Bus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Bus{nc: nc, cfg: cfg.withDefaults()}, nil
}

func (b *Bus) subject(node string) (string, error) {
	if !validToken(node) {
		return "", fmt.Errorf("nats: node name %q is not a subject token", node)
	}
	return b.cfg.Subject + "." + node, nil
}

// Publish sends d to node and waits for the node's ack, at most AckTimeout.
// It fails at once when the client is disconnected rather than buffering:
// a late push is no better than the client's own sync.
func (b *Bus) Publish(ctx context.Context, node string, d bus.Delivery) error {
	subj, err := b.subject(node)
	if err != nil {
		return err
	}
	if !b.nc.IsConnected() {
		return fmt.Errorf("nats: publish to %q: %w", node, ErrDisconnected)
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.AckTimeout)
	defer cancel()
	reply, err := b.nc.RequestWithContext(ctx, subj, encodeDelivery(d))
	switch {
	case errors.Is(err, natsio.ErrNoResponders):
		return fmt.Errorf("nats: publish to %q: %w", node, bus.ErrNoSubscriber)
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return fmt.Errorf("nats: publish to %q: %w within %s", node, ErrNoAck, b.cfg.AckTimeout)
	case err != nil:
		return fmt.Errorf("nats: publish to %q: %w", node, err)
	case string(reply.Data) == replyGone:
		return fmt.Errorf("nats: publish to %q: %w", node, bus.ErrNoSubscriber)
	case string(reply.Data) == replyStale:
		return fmt.Errorf("nats: publish to %q: %w", node, bus.ErrStale)
	case len(reply.Data) > 0:
		return fmt.Errorf("nats: publish to %q: %w: %s", node, ErrRejected, reply.Data)
	}
	return nil
}

// Subscribe routes node's deliveries to h. It returns once the server has
// registered the subscription, so a Publish from any client that starts
// after it finds the subscriber. cancel unsubscribes and waits for a running
// h to return; it must not be called from h.
func (b *Bus) Subscribe(ctx context.Context, node string, h bus.Handler) (func(), error) {
	subj, err := b.subject(node)
	if err != nil {
		return nil, err
	}
	var g Gate
	// Sent between cancel and the server's UNSUB: answer as NATS would a
	// moment later, rather than make the publisher time out.
	gone := func(m *natsio.Msg) { _ = m.Respond([]byte(replyGone)) }
	sub, err := b.nc.Subscribe(subj, g.Wrap(func(m *natsio.Msg) { b.handle(h, m) }, gone))
	if err != nil {
		return nil, fmt.Errorf("nats: subscribe %q: %w", node, err)
	}
	// FlushWithContext insists on a deadline.
	fctx, cancel := context.WithTimeout(ctx, b.cfg.AckTimeout)
	defer cancel()
	if err := b.nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("nats: subscribe %q: flush: %w", node, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			g.Close() // from here on, deliveries are answered gone
			_ = sub.Unsubscribe()
			// Once the server has the UNSUB, publishers get "no responders".
			fctx, cancel := context.WithTimeout(context.Background(), b.cfg.AckTimeout)
			_ = b.nc.FlushWithContext(fctx)
			cancel()
		})
	}, nil
}

// replyGone answers a delivery that reached a canceled subscription, and
// replyStale one whose group list the node does not hold (bus.ErrStale);
// neither can be mistaken for a decode error, which starts with "bad
// envelope".
const (
	replyGone  = "gone"
	replyStale = "stale"
)

func (b *Bus) handle(h bus.Handler, m *natsio.Msg) {
	d, err := decodeDelivery(m.Data)
	if err != nil {
		b.logLimited("undecodable delivery", "subject", m.Subject, "err", err)
		_ = m.Respond([]byte(err.Error()))
		return
	}
	if err := h(d); err != nil {
		reply := []byte(replyStale)
		if !errors.Is(err, bus.ErrStale) {
			reply = []byte("refused: " + err.Error())
		}
		_ = m.Respond(reply)
		return
	}
	// An empty reply is the ack; a failed one only costs the publisher a
	// timeout, so there is nothing more to do about it here.
	_ = m.Respond(nil)
}

// logLimited logs at most one line a second: a misbehaving publisher could
// otherwise log once per message.
func (b *Bus) logLimited(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := b.lastLog.Load()
	if now-last < int64(time.Second) || !b.lastLog.CompareAndSwap(last, now) {
		return
	}
	b.cfg.Logger.Warn(msg, args...)
}

// ValidName admits [A-Za-z0-9_-]{1,64}: a name that can be both a subject
// token and part of a durable consumer's name (task kinds, webhook
// endpoints).
func ValidName(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
