package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-im/parley/protocol"
)

// RunClusterSend is the durable 1:1 send benchmark against a running
// cluster: pair i's receiver connects to gateway i and its sender to the
// next gateway (mod their number), so with several gateways every message
// crosses from one gateway to another through the chat tier and the bus.
// It uses cfg's workload fields (Pairs, Messages, Inflight, BodyBytes,
// Timeout, Out, Logger); ServerBinary, Addr, DataDir and Fsyncs must be
// unset.
// The stored counter is read from the target's chat processes.
func RunClusterSend(ctx context.Context, t ClusterTarget, cfg SendConfig) (res SendResult, err error) {
	probe := cfg
	probe.ServerBinary = "-" // Validate wants a way to reach a node; t is it
	if err := errors.Join(t.Validate(), probe.Validate()); err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	if cfg.ServerBinary != "" || cfg.Addr != "" || cfg.DataDir != "" || cfg.Fsyncs {
		return SendResult{}, errors.New("bench send: a cluster run takes no server binary, addr, data dir or fsyncs")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	ds := t.dialers(4096)
	httpc := &http.Client{Timeout: 10 * time.Second}

	run := strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36)
	pairs := make([]*pair, cfg.Pairs)
	defer func() {
		for _, p := range pairs {
			if p != nil {
				p.close()
			}
		}
	}()
	for i := range pairs {
		recv, send := ds[i%len(ds)], ds[(i+1)%len(ds)]
		p, err := openPairAcross(ctx, send, recv, fmt.Sprintf("csend%s-%d", run, i), cfg.Messages, cfg.Inflight)
		if err != nil {
			return SendResult{}, fmt.Errorf("bench send: %w", err)
		}
		pairs[i] = p
	}
	fmt.Fprintf(cfg.Out, "cluster: gateways %v, chat processes %v; %d pairs × %d messages, %d in flight per sender, %d-byte bodies\n",
		t.Gateways, t.Chats, cfg.Pairs, cfg.Messages, cfg.Inflight, cfg.BodyBytes)

	before, err := t.scrape(ctx, httpc)
	if err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	res, err = runPairs(ctx, pairs, strings.Repeat("x", cfg.BodyBytes))
	if err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	after, err := t.scrape(ctx, httpc)
	if err != nil {
		return SendResult{}, fmt.Errorf("bench send: %w", err)
	}
	res.Stored = delta(before, after, "parley_messages_stored_total")
	res.Retransmits = delta(before, after, "parley_retransmits_total")
	res.Fsyncs = -1
	res.WriteTable(cfg.Out)
	if len(t.Chats) == 0 {
		fmt.Fprintln(cfg.Out, "(no chat processes given: the stored counter above is not the cluster's)")
	}
	if res.Errors > 0 {
		return res, fmt.Errorf("bench send: %d sends answered with an error", res.Errors)
	}
	return res, nil
}

// runPairs lets every pair send all its messages, waits for every ACK and
// delivery, and summarises the latencies.
func runPairs(ctx context.Context, pairs []*pair, body string) (SendResult, error) {
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.sendAll(ctx, body)
		}()
	}
	wg.Wait()
	for _, p := range pairs {
		if err := p.wait(ctx); err != nil {
			return SendResult{}, err
		}
	}
	var (
		res        SendResult
		acks, dels []time.Duration
		end        time.Time
	)
	for _, p := range pairs {
		p.mu.Lock()
		acks = append(acks, p.mu.ackLat...)
		dels = append(dels, p.mu.delLat...)
		res.Errors += p.mu.errors
		if p.mu.lastAck.After(end) {
			end = p.mu.lastAck
		}
		p.mu.Unlock()
		res.Messages += len(p.sentAt)
	}
	res.Acked, res.Delivered = len(acks), len(dels)
	res.Duration = end.Sub(start)
	res.Ack, res.Deliver = Summarize(acks), Summarize(dels)
	return res, nil
}

// openPairAcross is openPair with the sender and the receiver on their own
// nodes: the receiver connects first, through recv, so that it is online
// for every push.
func openPairAcross(ctx context.Context, send, recv *dialer, name string, messages, inflight int) (*pair, error) {
	p := &pair{
		senderUser: name + "a", base: time.Now(), sentAt: make([]atomic.Int64, messages),
		acked: make(chan struct{}), deliv: make(chan struct{}), opened: make(chan *protocol.Frame, 1),
		window: make(chan struct{}, inflight),
	}
	p.mu.seen = make([]bool, messages)
	rws, _, err := recv.dial(ctx, name+"b", "d1")
	if err != nil {
		return nil, err
	}
	p.receiver = &wsConn{ws: rws}
	sws, _, err := send.dial(ctx, p.senderUser, "d1")
	if err != nil {
		rws.Close()
		return nil, err
	}
	p.sender = &wsConn{ws: sws}
	p.readers.Add(2)
	go p.readLoop(p.sender, p.onSenderFrame)
	go p.readLoop(p.receiver, p.onReceiverFrame)
	if err := p.sender.write(&protocol.Frame{Type: protocol.TypeOpenDirect, RID: "open", Peer: name + "b"}); err != nil {
		p.close()
		return nil, fmt.Errorf("open direct: %w", err)
	}
	select {
	case f := <-p.opened:
		if f.Type != protocol.TypeConv || f.Conv == nil {
			p.close()
			return nil, fmt.Errorf("open direct: %s %s", f.Code, f.Error)
		}
		p.conv = f.Conv.ConvID
	case <-ctx.Done():
		p.close()
		return nil, fmt.Errorf("open direct: %w", ctx.Err())
	}
	return p, nil
}
