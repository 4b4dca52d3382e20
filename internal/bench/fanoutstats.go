package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Histogram counts latencies in whole milliseconds: the fan-out benchmark
// measures against a message's server_time, which has millisecond
// resolution, so finer buckets would only pretend to precision.
type Histogram map[int64]int64

// Record counts one latency of ms milliseconds; negative values (a clock
// step) count as 0.
func (h Histogram) Record(ms int64) { h[max(ms, 0)]++ }

// Merge adds o's counts to h.
func (h Histogram) Merge(o Histogram) {
	for ms, n := range o {
		h[ms] += n
	}
}

// Count is the number of samples.
func (h Histogram) Count() int64 {
	var n int64
	for _, c := range h {
		n += c
	}
	return n
}

// Summarize reports the histogram's percentiles with the same nearest-rank
// rule as Summarize, so every figure is a bucket that was observed.
func (h Histogram) Summarize() Latencies {
	n := h.Count()
	if n == 0 {
		return Latencies{}
	}
	keys := make([]int64, 0, len(h))
	for ms := range h {
		keys = append(keys, ms)
	}
	slices.Sort(keys)
	at := func(p float64) time.Duration {
		rank := max(1, min(int64(math.Ceil(p/100*float64(n))), n))
		var seen int64
		for _, ms := range keys {
			if seen += h[ms]; seen >= rank {
				return time.Duration(ms) * time.Millisecond
			}
		}
		return time.Duration(keys[len(keys)-1]) * time.Millisecond
	}
	return Latencies{N: int(n), P50: at(50), P99: at(99), Max: time.Duration(keys[len(keys)-1]) * time.Millisecond}
}

// SeqCount is how many connections of a client process received message
// Seq of conversation Conv for the first time.
type SeqCount struct {
	Conv uint64 `json:"conv,string"`
	Seq  uint64 `json:"seq"`
	N    int64  `json:"n"`
}

// FanoutReport is what a fan-out client process tells the benchmark.
type FanoutReport struct {
	Opened int `json:"opened"` // connections opened
	Live   int `json:"live"`   // of them, not closed by the server
	// Counts are the first receipts of text messages, per (conv, seq).
	Counts []SeqCount `json:"counts"`
	// Dups are text pushes at or below the seq a connection already had
	// (re-sends); Gaps are pushes that skipped seqs on their connection.
	Dups int64 `json:"dups"`
	Gaps int64 `json:"gaps"`
	// Latency is receipt time − server_time of every first receipt, ms.
	Latency Histogram `json:"latency_ms"`
	// FromSend is receipt time − the send time stamped in the body, ms:
	// it adds the time the send waited at the node before it got its
	// server_time.
	FromSend Histogram `json:"from_send_ms"`
	// FirstNS and LastNS are the Unix times, ns, of the first and the last
	// first receipt (0 if none).
	FirstNS int64 `json:"first_ns"`
	LastNS  int64 `json:"last_ns"`
}

// parseReport reads a "report {json}" line.
func parseReport(line string) (FanoutReport, error) {
	rest, ok := strings.CutPrefix(line, respReport+" ")
	if !ok {
		return FanoutReport{}, fmt.Errorf("parse report: not a report line: %.200q", line)
	}
	var r FanoutReport
	if err := json.Unmarshal([]byte(rest), &r); err != nil {
		return FanoutReport{}, fmt.Errorf("parse report: %w", err)
	}
	if r.Latency == nil {
		r.Latency = Histogram{}
	}
	if r.FromSend == nil {
		r.FromSend = Histogram{}
	}
	return r, nil
}

// mergeReports combines the reports of a scenario's client processes.
func mergeReports(rs []FanoutReport) FanoutReport {
	out := FanoutReport{Latency: Histogram{}, FromSend: Histogram{}}
	counts := map[SeqCount]int64{} // key with N zeroed
	for _, r := range rs {
		out.Opened += r.Opened
		out.Live += r.Live
		out.Dups += r.Dups
		out.Gaps += r.Gaps
		out.Latency.Merge(r.Latency)
		out.FromSend.Merge(r.FromSend)
		for _, c := range r.Counts {
			counts[SeqCount{Conv: c.Conv, Seq: c.Seq}] += c.N
		}
		if r.FirstNS != 0 && (out.FirstNS == 0 || r.FirstNS < out.FirstNS) {
			out.FirstNS = r.FirstNS
		}
		out.LastNS = max(out.LastNS, r.LastNS)
	}
	for k, n := range counts {
		k.N = n
		out.Counts = append(out.Counts, k)
	}
	slices.SortFunc(out.Counts, func(a, b SeqCount) int {
		if a.Conv != b.Conv {
			return cmpUint(a.Conv, b.Conv)
		}
		return cmpUint(a.Seq, b.Seq)
	})
	return out
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// DeliveryCheck compares the receipts of a conversation's messages with
// what every online member should have received exactly once.
type DeliveryCheck struct {
	Want      int64 // messages × members online in the client processes
	Delivered int64 // first receipts of those messages
	Missing   int64 // receipts that did not happen
	Extra     int64 // receipts beyond one per member and message
}

// OK reports whether every member received every message exactly once.
func (c DeliveryCheck) OK() bool { return c.Missing == 0 && c.Extra == 0 }

// checkDeliveries counts, for each of seqs in conv, the first receipts in
// counts against members (one connection each).
func checkDeliveries(counts []SeqCount, conv uint64, seqs []uint64, members int) DeliveryCheck {
	got := make(map[uint64]int64, len(seqs))
	for _, c := range counts {
		if c.Conv == conv {
			got[c.Seq] += c.N
		}
	}
	var dc DeliveryCheck
	for _, s := range seqs {
		n, want := got[s], int64(members)
		dc.Want += want
		dc.Delivered += n
		dc.Missing += max(0, want-n)
		dc.Extra += max(0, n-want)
	}
	return dc
}

// ExpectedRows is the design's write amplification (docs/architecture.md): conversation-row writes
// per message of a group of members, onlineUsers of them online, in tier
// (small, medium, large). It returns -1 for an unknown tier.
func ExpectedRows(tier string, members, onlineUsers int) int {
	switch tier {
	case "small":
		return members // write fan-out to every member's row
	case "medium":
		return onlineUsers // rows only for those online at send time
	case "large":
		return 0 // the message and the group's last_seq only
	}
	return -1
}

// splitRange divides [0, n) into k contiguous parts whose sizes differ by
// at most one; parts may be empty when k > n.
func splitRange(n, k int) [][2]int {
	out := make([][2]int, k)
	from := 0
	for i := range k {
		size := n / k
		if i < n%k {
			size++
		}
		out[i] = [2]int{from, from + size}
		from += size
	}
	return out
}

// chunks divides ids into slices of at most size.
func chunks(ids []string, size int) [][]string {
	var out [][]string
	for len(ids) > size {
		out = append(out, ids[:size])
		ids = ids[size:]
	}
	if len(ids) > 0 {
		out = append(out, ids)
	}
	return out
}

// stampLen is the size of the send-time stamp that starts a benchmark
// message body: Unix nanoseconds, 19 decimal digits until the year 2286.
const stampLen = 19

// stampBody returns a body of size bytes (at least stampLen) that starts
// with the send time, so that receivers in other processes can time the
// whole path on the machine's one clock.
func stampBody(sent time.Time, size int) string {
	s := fmt.Sprintf("%0*d", stampLen, sent.UnixNano())
	return s + strings.Repeat("x", max(0, size-len(s)))
}

// parseStamp reads the send time of a stamped body.
func parseStamp(body string) (time.Time, bool) {
	if len(body) < stampLen {
		return time.Time{}, false
	}
	return parseStampBytes([]byte(body[:stampLen]))
}

// parseStampBytes reads a stamp: exactly stampLen digits.
func parseStampBytes(b []byte) (time.Time, bool) {
	if len(b) != stampLen {
		return time.Time{}, false
	}
	var ns int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return time.Time{}, false
		}
		ns = ns*10 + int64(c-'0')
	}
	return time.Unix(0, ns), true
}
