package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/parley-im/parley/protocol"
)

// HistoryConfig configures the history-read benchmark.
type HistoryConfig struct {
	// Convs direct conversations are seeded, each by its own connection,
	// which then reads it: reads of different conversations run in
	// parallel, reads of one conversation one after another (a
	// connection's requests are served in order).
	Convs int
	// Messages are seeded per conversation; more than Limit, so that the
	// latest page is a full one and pages before it exist.
	Messages  int
	BodyBytes int
	Reads     int // history requests per conversation and kind
	Limit     int // messages per page
	Timeout   time.Duration
	Out       io.Writer
	Logger    *slog.Logger
}

// DefaultHistoryConfig returns the defaults of `parley-bench history`.
func DefaultHistoryConfig() HistoryConfig {
	return HistoryConfig{
		Convs: 8, Messages: 300, BodyBytes: 100, Reads: 250, Limit: 50, Timeout: 10 * time.Minute,
		Out: os.Stdout, Logger: slog.Default(),
	}
}

// Validate reports a configuration the benchmark cannot run with.
func (c HistoryConfig) Validate() error {
	var errs []error
	if c.Convs < 1 || c.Reads < 1 || c.BodyBytes < 1 {
		errs = append(errs, fmt.Errorf("convs, reads and body bytes must be positive, got %d, %d, %d", c.Convs, c.Reads, c.BodyBytes))
	}
	if c.Limit < 1 || c.Limit > protocol.DefaultLimits.MaxHistory {
		errs = append(errs, fmt.Errorf("limit must be in 1..%d, got %d", protocol.DefaultLimits.MaxHistory, c.Limit))
	}
	if c.Messages < 2*c.Limit {
		errs = append(errs, fmt.Errorf("messages must be at least twice the limit (%d), got %d", 2*c.Limit, c.Messages))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout must be positive, got %v", c.Timeout))
	}
	if c.Out == nil || c.Logger == nil {
		errs = append(errs, errors.New("out and logger are required"))
	}
	return errors.Join(errs...)
}

// HistoryResult is what the history benchmark measured.
type HistoryResult struct {
	Seeded   int           // messages stored to seed the conversations
	SeedTime time.Duration // first seed send → last seed ACK
	Latest   Latencies     // history with neither after_seq nor before_seq
	Before   Latencies     // a page before a random seq
	// LatestTime and BeforeTime are the wall time of each phase.
	LatestTime, BeforeTime time.Duration
}

// WriteTable writes the result as a Markdown table.
func (r HistoryResult) WriteTable(w io.Writer, cfg HistoryConfig) {
	rate := func(n int, d time.Duration) float64 {
		if d <= 0 {
			return 0
		}
		return float64(n) / d.Seconds()
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| read | requests | requests/s | p50 | p99 | max |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	fmt.Fprintf(w, "| latest %d | %d | %.0f | %s | %s | %s |\n", cfg.Limit, r.Latest.N, rate(r.Latest.N, r.LatestTime), ms(r.Latest.P50), ms(r.Latest.P99), ms(r.Latest.Max))
	fmt.Fprintf(w, "| %d before a random seq | %d | %.0f | %s | %s | %s |\n", cfg.Limit, r.Before.N, rate(r.Before.N, r.BeforeTime), ms(r.Before.P50), ms(r.Before.P99), ms(r.Before.Max))
	fmt.Fprintf(w, "\nseeding: %d messages in %v (%.0f ACKed msgs/s over %d conversations, one sender each, 1 in flight)\n",
		r.Seeded, r.SeedTime.Round(time.Millisecond), rate(r.Seeded, r.SeedTime), cfg.Convs)
}

// RunClusterHistory measures history reads through a cluster's gateways:
// it seeds Convs direct conversations with Messages messages each (their
// owners spread over the gateways), then times Reads "latest Limit"
// requests per conversation, then Reads pages before a random seq. Every
// answer is checked: a full page of consecutive seqs ending where asked.
func RunClusterHistory(ctx context.Context, t ClusterTarget, cfg HistoryConfig) (res HistoryResult, err error) {
	if err := errors.Join(t.Validate(), cfg.Validate()); err != nil {
		return HistoryResult{}, fmt.Errorf("bench history: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	ds := t.dialers(64 << 10)
	run := strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36)
	readers := make([]*historyReader, cfg.Convs)
	defer func() {
		for _, r := range readers {
			if r != nil {
				r.c.close()
			}
		}
	}()
	for i := range readers {
		user := fmt.Sprintf("hist%s-%d", run, i)
		c, err := dialRPC(ctx, ds[i%len(ds)], user+"a", "d1")
		if err != nil {
			return res, fmt.Errorf("bench history: %w", err)
		}
		readers[i] = &historyReader{c: c}
		f, err := c.call(ctx, &protocol.Frame{Type: protocol.TypeOpenDirect, Peer: user + "b"})
		if err != nil {
			return res, fmt.Errorf("bench history: open direct: %w", err)
		}
		readers[i].conv = f.Conv.ConvID
	}
	fmt.Fprintf(cfg.Out, "cluster: gateways %v; %d conversations × %d messages, %d reads of %d per conversation and kind\n",
		t.Gateways, cfg.Convs, cfg.Messages, cfg.Reads, cfg.Limit)

	start := time.Now()
	if err := eachReader(readers, func(i int, r *historyReader) error {
		seqs, errs, err := r.c.sendAll(ctx, r.conv, fmt.Sprintf("h%s-%d-", run, i), cfg.Messages, 0, cfg.BodyBytes)
		switch {
		case err != nil:
			return err
		case errs > 0 || len(seqs) != cfg.Messages:
			return fmt.Errorf("seeding: %d of %d ACKed, %d errors", len(seqs), cfg.Messages, errs)
		}
		r.last = seqs[len(seqs)-1]
		return nil
	}); err != nil {
		return res, fmt.Errorf("bench history: %w", err)
	}
	res.Seeded, res.SeedTime = cfg.Convs*cfg.Messages, time.Since(start)
	cfg.Logger.Info("seeded", "messages", res.Seeded, "took", res.SeedTime.Round(time.Millisecond))

	phase := func(before func(r *historyReader) uint64) (Latencies, time.Duration, error) {
		start := time.Now()
		err := eachReader(readers, func(_ int, r *historyReader) error {
			for range cfg.Reads {
				if err := r.read(ctx, before(r), cfg.Limit); err != nil {
					return err
				}
			}
			return nil
		})
		took := time.Since(start)
		var all []time.Duration
		for _, r := range readers {
			all = append(all, r.lat...)
			r.lat = r.lat[:0]
		}
		return Summarize(all), took, err
	}
	if res.Latest, res.LatestTime, err = phase(func(*historyReader) uint64 { return 0 }); err != nil {
		return res, fmt.Errorf("bench history: latest: %w", err)
	}
	if res.Before, res.BeforeTime, err = phase(func(r *historyReader) uint64 {
		// Any page that is full: before_seq in limit+1 … last.
		return uint64(cfg.Limit) + 1 + rand.Uint64N(r.last-uint64(cfg.Limit))
	}); err != nil {
		return res, fmt.Errorf("bench history: before: %w", err)
	}
	res.WriteTable(cfg.Out, cfg)
	return res, nil
}

// historyReader is one conversation and the connection of its owner.
type historyReader struct {
	c    *rpcConn
	conv uint64
	last uint64 // the conversation's last seq
	lat  []time.Duration
}

// read asks for the limit messages before before (0: the latest), times
// the answer and checks it.
func (r *historyReader) read(ctx context.Context, before uint64, limit int) error {
	t0 := time.Now()
	f, err := r.c.call(ctx, &protocol.Frame{Type: protocol.TypeHistory, ConvID: r.conv, BeforeSeq: before, Limit: limit})
	lat := time.Since(t0)
	if err != nil {
		return err
	}
	top := r.last
	if before != 0 {
		top = before - 1
	}
	ms := f.Messages
	if len(ms) != limit || ms[0].Seq != top-uint64(limit)+1 || ms[len(ms)-1].Seq != top {
		got := "none"
		if len(ms) > 0 {
			got = fmt.Sprintf("%d..%d", ms[0].Seq, ms[len(ms)-1].Seq)
		}
		return fmt.Errorf("history before %d: got %d messages (%s), want %d ending at %d", before, len(ms), got, limit, top)
	}
	r.lat = append(r.lat, lat)
	return nil
}

// eachReader runs f for every reader at once and returns the first error.
func eachReader(rs []*historyReader, f func(i int, r *historyReader) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, r)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
