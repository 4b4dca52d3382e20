// Package metrics owns Parley's Prometheus instruments. New registers every
// collector on the Registerer it is given (a fresh registry in tests, the
// server's registry in production), so nothing touches the global default
// registry and two servers in one test process do not collide.
//
// Label values must come from small fixed sets (frame types, error codes, the
// Result*/Reason*/Op* constants below), never from user input: each distinct
// value is a time series held forever.
//
// Concurrency: a *Metrics is read-only after New; its collectors are safe for
// concurrent use.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-im/parley/internal/buildinfo"

	"github.com/parley-im/parley/protocol"
)

// Values of the result label of parley_handshakes_total: what the gateway
// answered a new session's request (docs/deploy.md, "Monitoring").
const (
	ResultOK            = "ok"
	ResultUnauthorized  = "unauthorized"   // no token, or a bad one (401)
	ResultExpired       = "expired"        // an expired token (401)
	ResultBadRequest    = "bad_request"    // a bad device id, or not the token's (400)
	ResultRateLimited   = "rate_limited"   // the node's handshake budget spent (503)
	ResultFull          = "full"           // gateway.max_connections reached (503)
	ResultDraining      = "draining"       // the node drains (503)
	ResultUserRate      = "user_rate"      // the user's handshake rate (429)
	ResultUserCap       = "user_cap"       // the user's session cap (429)
	ResultUpgradeFailed = "upgrade_failed" // the WebSocket upgrade itself failed
	ResultBanned        = "banned"         // the user is banned (403, server API)
	ResultRevoked       = "revoked"        // the token is revoked (401, server API)
)

// handshakeResults are every result, created up front.
var handshakeResults = []string{ResultOK, ResultUnauthorized, ResultExpired, ResultBadRequest, ResultRateLimited,
	ResultFull, ResultDraining, ResultUserRate, ResultUserCap, ResultUpgradeFailed, ResultBanned, ResultRevoked}

// errorCodes are every client-facing error code, the values of the code
// label of parley_errors_total, created up front.
var errorCodes = []protocol.Code{
	protocol.CodeBadFrame, protocol.CodeUnknownType, protocol.CodeInvalidArgument, protocol.CodeTooLarge,
	protocol.CodeUnauthorized, protocol.CodeTokenExpired, protocol.CodeNotMember, protocol.CodeForbidden,
	protocol.CodeNotFound, protocol.CodeConflict, protocol.CodeRecallExpired, protocol.CodeRateLimited,
	protocol.CodeStoreUnavailable, protocol.CodeInternal, protocol.CodeTimeout, protocol.CodeOverloaded,
	protocol.CodeE2ERequired, protocol.CodeE2EUnsupported, protocol.CodeBadKey, protocol.CodeAccountConflict,
	protocol.CodeTokenRevoked, protocol.CodeBanned,
	protocol.CodeQuotaExceeded, protocol.CodeTooManyUploads, protocol.CodeSizeMismatch, protocol.CodeHashMismatch,
	protocol.CodePartOutOfOrder, protocol.CodeUploadIncomplete, protocol.CodeNotReady, protocol.CodeTooManyRegistrations, protocol.CodeBadReference,
	protocol.CodeQueryTooLong, protocol.CodeQueryTooComplex, protocol.CodeBadCursor, protocol.CodeSearchUnavailable,
}

// Values of the kind label of parley_compensations_total (ledger.KindRows,
// ledger.KindPush), created up front.
var compensationKinds = []string{"rows", "push"}

// Values of the reason label of parley_queue_drops_total.
const (
	ReasonSlowConsumer     = "slow_consumer"
	ReasonInflightOverflow = "inflight_overflow"
)

// Values of the op label of parley_store_errors_total are the store method
// names ("Append", "Sync", ...), a fixed set.

// frameUnknown labels frames whose type the server does not accept, so a
// client sending random types cannot mint new series.
const frameUnknown = "unknown"

// clientFrames are the frame types a client may send.
var clientFrames = protocol.ClientTypes

// latencyBuckets span 0.5ms to 5s: an in-process ACK lands in the first few,
// a struggling disk or a cross-node hop in the upper ones.
var latencyBuckets = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
}

// Metrics holds every Parley collector.
type Metrics struct {
	Connections  prometheus.Gauge
	Handshakes   *prometheus.CounterVec // result
	FramesIn     *prometheus.CounterVec // type
	Errors       *prometheus.CounterVec // code (protocol.Code)
	Stored       prometheus.Counter
	Shed         prometheus.Counter   // sends answered overloaded: the fan-out was behind chat.max_fanout_lag
	SendAck      prometheus.Histogram // frame received → stored ACK written, seconds
	Delivery     prometheus.Histogram // message stored → recipient device's delivered ACK, seconds
	Pushes       prometheus.Counter
	Retransmits  prometheus.Counter
	QueueDrops   *prometheus.CounterVec // reason
	SnapshotConv prometheus.Histogram   // conversations in one sync snapshot
	StoreErrors  *prometheus.CounterVec // op
	// Group fan-out: per tier, messages fanned out, conversation
	// rows written and users pushed to. rows/messages is the write
	// amplification of docs/architecture.md's tier table.
	FanoutMessages *prometheus.CounterVec // tier
	FanoutRows     *prometheus.CounterVec // tier
	FanoutPushes   *prometheus.CounterVec // tier
	Compensations  *prometheus.CounterVec // kind: tasks completed by the ledger
}

// New creates the collectors and registers them on reg. It panics if one is
// already registered there, which is a programming error (two Metrics on
// one registry), like prometheus.MustRegister.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "parley_connections",
			Help: "Client connections currently open on this node.",
		}),
		Handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_handshakes_total",
			Help: "Connection handshakes by result.",
		}, []string{"result"}),
		FramesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_frames_in_total",
			Help: "Frames received from clients by frame type.",
		}, []string{"type"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_errors_total",
			Help: "Error frames sent to clients by error code.",
		}, []string{"code"}),
		Stored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_messages_stored_total",
			Help: "Messages persisted (the stored ACK was due).",
		}),
		Shed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_sends_shed_total",
			Help: "Sends answered overloaded, nothing stored, because this process's fan-out was further behind its ACKs than chat.max_fanout_lag.",
		}),
		SendAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "parley_send_ack_seconds",
			Help:    "Time from receiving a send frame to writing its stored ACK.",
			Buckets: latencyBuckets,
		}),
		Delivery: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "parley_delivery_seconds",
			Help:    "Time from a message being stored to a recipient device acknowledging delivery.",
			Buckets: latencyBuckets,
		}),
		Pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_pushes_total",
			Help: "Messages pushed to connected devices, first attempts only.",
		}),
		Retransmits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_retransmits_total",
			Help: "Pushes re-sent because no delivered ACK arrived in time.",
		}),
		QueueDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_queue_drops_total",
			Help: "Connections dropped because their outbound queue or in-flight window overflowed, by reason.",
		}, []string{"reason"}),
		SnapshotConv: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "parley_snapshot_convs",
			Help:    "Conversations carried in one sync snapshot.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8), // 1 … 16384
		}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_store_errors_total",
			Help: "Failed store operations by operation.",
		}, []string{"op"}),
		FanoutMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_fanout_messages_total",
			Help: "Stored messages fanned out, by the conversation's tier.",
		}, []string{"tier"}),
		FanoutRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_fanout_row_writes_total",
			Help: "Conversation-row writes of fan-out, by tier (write amplification = rows / messages).",
		}, []string{"tier"}),
		FanoutPushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_fanout_pushes_total",
			Help: "Users pushed to by fan-out, by tier.",
		}, []string{"tier"}),
		Compensations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_compensations_total",
			Help: "Compensation tasks completed, by kind.",
		}, []string{"kind"}),
	}
	reg.MustRegister(
		m.Connections, m.Handshakes, m.FramesIn, m.Errors, m.Stored, m.Shed, m.SendAck,
		m.Delivery, m.Pushes, m.Retransmits, m.QueueDrops, m.SnapshotConv, m.StoreErrors,
		m.FanoutMessages, m.FanoutRows, m.FanoutPushes, m.Compensations,
	)
	for _, t := range []string{"small", "medium", "large"} {
		m.FanoutMessages.WithLabelValues(t)
		m.FanoutRows.WithLabelValues(t)
		m.FanoutPushes.WithLabelValues(t)
	}
	// Creating the known series up front makes them exported as 0, so rate()
	// and alerts work before the first event rather than seeing no series.
	for _, r := range handshakeResults {
		m.Handshakes.WithLabelValues(r)
	}
	for _, c := range errorCodes {
		m.Errors.WithLabelValues(string(c))
	}
	for _, k := range compensationKinds {
		m.Compensations.WithLabelValues(k)
	}
	for _, r := range []string{ReasonSlowConsumer, ReasonInflightOverflow} {
		m.QueueDrops.WithLabelValues(r)
	}
	bi := buildinfo.Get()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "parley_build_info",
		Help: "Always 1; the labels name the running build: version, commit and Go release.",
	}, []string{"version", "commit", "go"})
	build.WithLabelValues(bi.Version, bi.Commit, bi.Go).Set(1)
	reg.MustRegister(build)
	for _, t := range append(clientFrames, frameUnknown) {
		m.FramesIn.WithLabelValues(t)
	}
	return m
}

// FrameIn counts one received frame of type typ; types the server does not
// accept are counted as "unknown".
func (m *Metrics) FrameIn(typ string) {
	for _, t := range clientFrames {
		if t == typ {
			m.FramesIn.WithLabelValues(typ).Inc()
			return
		}
	}
	m.FramesIn.WithLabelValues(frameUnknown).Inc()
}
