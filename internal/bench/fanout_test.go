package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

func TestHistogramSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    Histogram
		want Latencies
	}{
		{"empty", Histogram{}, Latencies{}},
		{"one bucket", Histogram{7: 10}, Latencies{N: 10, P50: 7 * time.Millisecond, P99: 7 * time.Millisecond, Max: 7 * time.Millisecond}},
		// 100 samples: ranks 50 and 99 fall in buckets 1 and 5.
		{"spread", Histogram{1: 50, 2: 30, 5: 19, 40: 1}, Latencies{N: 100, P50: time.Millisecond, P99: 5 * time.Millisecond, Max: 40 * time.Millisecond}},
		{"rank just past a bucket", Histogram{1: 49, 3: 51}, Latencies{N: 100, P50: 3 * time.Millisecond, P99: 3 * time.Millisecond, Max: 3 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.h.Summarize(); got != tc.want {
				t.Errorf("Summarize() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The histogram must agree with Summarize over the expanded samples: both
// are nearest-rank.
func TestHistogramMatchesSummarize(t *testing.T) {
	h := Histogram{}
	var ds []time.Duration
	for i := range 1000 {
		ms := int64((i * 7919) % 83)
		h.Record(ms)
		ds = append(ds, time.Duration(ms)*time.Millisecond)
	}
	if got, want := h.Summarize(), Summarize(ds); got != want {
		t.Errorf("histogram %+v, samples %+v", got, want)
	}
}

func TestHistogramRecordClampsNegative(t *testing.T) {
	h := Histogram{}
	h.Record(-3)
	h.Record(2)
	if want := (Histogram{0: 1, 2: 1}); !reflect.DeepEqual(h, want) {
		t.Errorf("got %v, want %v", h, want)
	}
}

func TestMergeReports(t *testing.T) {
	a := FanoutReport{Opened: 2, Live: 2, Dups: 1, Latency: Histogram{1: 2, 3: 1}, FromSend: Histogram{4: 3}, FirstNS: 50, LastNS: 90,
		Counts: []SeqCount{{Conv: 9, Seq: 2, N: 2}, {Conv: 9, Seq: 1, N: 2}}}
	b := FanoutReport{Opened: 3, Live: 2, Gaps: 1, Latency: Histogram{3: 4}, FromSend: Histogram{4: 1, 9: 3}, FirstNS: 40, LastNS: 80,
		Counts: []SeqCount{{Conv: 9, Seq: 1, N: 3}, {Conv: 4, Seq: 7, N: 1}}}
	idle := FanoutReport{Opened: 1, Live: 1, Latency: Histogram{}}
	got := mergeReports([]FanoutReport{a, b, idle})
	want := FanoutReport{Opened: 6, Live: 5, Dups: 1, Gaps: 1, Latency: Histogram{1: 2, 3: 5}, FromSend: Histogram{4: 4, 9: 3}, FirstNS: 40, LastNS: 90,
		Counts: []SeqCount{{Conv: 4, Seq: 7, N: 1}, {Conv: 9, Seq: 1, N: 5}, {Conv: 9, Seq: 2, N: 2}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merge:\n got %+v\nwant %+v", got, want)
	}
}

func TestCheckDeliveries(t *testing.T) {
	counts := []SeqCount{{Conv: 1, Seq: 10, N: 3}, {Conv: 1, Seq: 11, N: 2}, {Conv: 1, Seq: 12, N: 4}, {Conv: 2, Seq: 10, N: 3}}
	for _, tc := range []struct {
		name string
		seqs []uint64
		want DeliveryCheck
	}{
		{"all there", []uint64{10}, DeliveryCheck{Want: 3, Delivered: 3}},
		{"one short", []uint64{10, 11}, DeliveryCheck{Want: 6, Delivered: 5, Missing: 1}},
		{"one too many", []uint64{12}, DeliveryCheck{Want: 3, Delivered: 4, Extra: 1}},
		{"never received", []uint64{13}, DeliveryCheck{Want: 3, Missing: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkDeliveries(counts, 1, tc.seqs, 3)
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if got.OK() != (tc.want.Missing == 0 && tc.want.Extra == 0) {
				t.Errorf("OK() = %v for %+v", got.OK(), got)
			}
		})
	}
}

func TestExpectedRows(t *testing.T) {
	for _, tc := range []struct {
		tier            string
		members, online int
		want            int
	}{
		{"small", 199, 1, 199},
		{"medium", 2000, 400, 400},
		{"large", 10000, 10000, 0},
		{"", 10, 1, -1},
	} {
		if got := ExpectedRows(tc.tier, tc.members, tc.online); got != tc.want {
			t.Errorf("ExpectedRows(%q, %d, %d) = %d, want %d", tc.tier, tc.members, tc.online, got, tc.want)
		}
	}
}

func TestSplitRangeAndChunks(t *testing.T) {
	if got, want := splitRange(10, 3), [][2]int{{0, 4}, {4, 7}, {7, 10}}; !reflect.DeepEqual(got, want) {
		t.Errorf("splitRange(10, 3) = %v, want %v", got, want)
	}
	if got, want := splitRange(1, 2), [][2]int{{0, 1}, {1, 1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("splitRange(1, 2) = %v, want %v", got, want)
	}
	ids := []string{"a", "b", "c", "d", "e"}
	if got, want := chunks(ids, 2), [][]string{{"a", "b"}, {"c", "d"}, {"e"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("chunks(5 ids, 2) = %v, want %v", got, want)
	}
	if got := chunks(ids, 5); len(got) != 1 || len(got[0]) != 5 {
		t.Errorf("chunks(5 ids, 5) = %v, want one chunk", got)
	}
}

func TestParseReport(t *testing.T) {
	r, err := parseReport(`report {"opened":2,"live":2,"counts":[{"conv":"18446744073709551615","seq":3,"n":2}],"latency_ms":{"4":2},"from_send_ms":{"6":2},"first_ns":1,"last_ns":2}`)
	if err != nil {
		t.Fatal(err)
	}
	want := FanoutReport{Opened: 2, Live: 2, Counts: []SeqCount{{Conv: 1<<64 - 1, Seq: 3, N: 2}}, Latency: Histogram{4: 2}, FromSend: Histogram{6: 2}, FirstNS: 1, LastNS: 2}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("got %+v, want %+v", r, want)
	}
	for _, bad := range []string{"ready 3", "report {", "err boom"} {
		if _, err := parseReport(bad); err == nil {
			t.Errorf("parseReport(%q) succeeded, want an error", bad)
		}
	}
}

func TestStampBody(t *testing.T) {
	sent := time.Unix(1_700_000_000, 123_456_789)
	for _, size := range []int{stampLen, 100} {
		b := stampBody(sent, size)
		if len(b) != size {
			t.Errorf("stampBody(%d) has %d bytes", size, len(b))
		}
		got, ok := parseStamp(b)
		if !ok || !got.Equal(sent) {
			t.Errorf("parseStamp(stampBody(%v, %d)) = %v, %v", sent, size, got, ok)
		}
	}
	for _, body := range []string{"", "hello", "12345678901234567x9", "-234567890123456789"} {
		if _, ok := parseStamp(body); ok {
			t.Errorf("parseStamp(%q) succeeded, want false", body)
		}
	}
}

func TestFanoutConfigValidate(t *testing.T) {
	base := DefaultFanoutConfig()
	base.ServerBinary, base.ClientBinary = "/bin/parley", "/bin/parley-bench"
	base.ClientArgs = func(FanoutClientConfig) []string { return nil }
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults with a binary: %v", err)
	}
	attached := base // to a running node, clients in this process: no binary needed
	attached.ServerBinary, attached.ClientBinary = "", ""
	attached.Addr, attached.DataDir, attached.startClient = "127.0.0.1:1", "/tmp", inProcessClient()
	if err := attached.Validate(); err != nil {
		t.Fatalf("attached with in-process clients: %v", err)
	}
	for name, mut := range map[string]func(*FanoutConfig){
		"online above members": func(c *FanoutConfig) { c.Scenarios = []FanoutScenario{{Name: "x", Members: 5, Online: 6, Procs: 1}} },
		"online without procs": func(c *FanoutConfig) { c.Scenarios = []FanoutScenario{{Name: "x", Members: 5, Online: 2}} },
		"too many per process": func(c *FanoutConfig) { c.Scenarios = DefaultFanoutScenarios(20000, 1) },
		"no scenarios":         func(c *FanoutConfig) { c.Scenarios = nil },
		"negative rate":        func(c *FanoutConfig) { c.Rate = -1 },
		"body below the stamp": func(c *FanoutConfig) { c.BodyBytes = stampLen - 1 },
		"no client args":       func(c *FanoutConfig) { c.ClientArgs = nil },
		"no server binary":     func(c *FanoutConfig) { c.ServerBinary = "" },
		"no client binary":     func(c *FanoutConfig) { c.ClientBinary = "" },
	} {
		c := base
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate succeeded, want an error", name)
		}
	}
}

// inProcessClient runs RunFanoutClient on a goroutine behind pipes, as the
// child process would run it.
func inProcessClient() func(string, FanoutClientConfig) (*fanoutProc, error) {
	return func(name string, cc FanoutClientConfig) (*fanoutProc, error) {
		cc.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := RunFanoutClient(context.Background(), cc, inR, outW)
			outW.Close()
			done <- err
		}()
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
		return &fanoutProc{name: name, stdin: inW, out: sc, end: func() error {
			inW.Close()
			// Drain what the client may still write so it can return.
			go io.Copy(io.Discard, outR)
			return <-done
		}}, nil
	}
}

// TestRunFanoutTiers runs the whole benchmark against an in-process node
// with small thresholds, so each tier's write amplification and the
// exactly-once delivery check are exercised with a few dozen users.
func TestRunFanoutTiers(t *testing.T) {
	srv, dir := startNode(t,
		servertest.WithChat(func(c *chat.Config) { c.SmallBelow, c.LargeAbove = 5, 20 }),
		servertest.WithGateway(func(c *gateway.Config) {
			c.HandshakeRate, c.HandshakeBurst = 10000, 10000
			c.RetransmitAfter = time.Second
		}))
	cfg := DefaultFanoutConfig()
	cfg.Addr, cfg.DataDir = strings.TrimPrefix(srv.URL, "ws://"), dir
	cfg.Scenarios = []FanoutScenario{
		{Name: "small", Members: 4},
		{Name: "medium", Members: 12, Online: 5, Procs: 2},
		{Name: "large", Members: 30, Online: 3, Procs: 1},
		{Name: "delivery", Members: 25, Online: 25, Procs: 3},
	}
	cfg.Messages, cfg.Rate, cfg.Chunk = 12, 0, 7
	cfg.AckEvery = 200 * time.Millisecond
	cfg.DeliveryWait = 5 * time.Second
	cfg.Timeout = time.Minute
	cfg.startClient = inProcessClient()
	cfg.WindowFile = filepath.Join(t.TempDir(), "window")
	var out bytes.Buffer
	cfg.Out, cfg.Stderr = &out, io.Discard
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))

	res, err := RunFanout(context.Background(), cfg)
	if testing.Verbose() {
		os.Stdout.Write(out.Bytes())
	}
	if err != nil {
		t.Fatalf("RunFanout: %v", err)
	}
	if len(res) != len(cfg.Scenarios) {
		t.Fatalf("%d results for %d scenarios", len(res), len(cfg.Scenarios))
	}
	want := []struct {
		tier           string
		rows, pushes   float64
		delivered, per int64
	}{
		{"small", 4, 1, 0, 0},
		{"medium", 5, 5, 12 * 5, 5},
		{"large", 0, 3, 12 * 3, 3},
		{"large", 0, 25, 12 * 25, 25},
	}
	for i, r := range res {
		w := want[i]
		if r.Tier != w.tier || r.RowsPerMessage() != w.rows || r.PushesPerMessage() != w.pushes {
			t.Errorf("%s: tier %q rows/msg %v pushes/msg %v, want %q %v %v",
				r.Scenario.Name, r.Tier, r.RowsPerMessage(), r.PushesPerMessage(), w.tier, w.rows, w.pushes)
		}
		if r.Acked != 12 || r.FanoutMessages != 12 || r.WritesPerMessage() != 1+w.rows {
			t.Errorf("%s: acked %d fanned out %v writes/msg %v", r.Scenario.Name, r.Acked, r.FanoutMessages, r.WritesPerMessage())
		}
		if r.Check.Delivered != w.delivered || !r.Check.OK() || r.Dups != 0 || r.Gaps != 0 {
			t.Errorf("%s: deliveries %+v dups %d gaps %d, want %d delivered exactly once",
				r.Scenario.Name, r.Check, r.Dups, r.Gaps, w.delivered)
		}
		if w.delivered > 0 && (r.Latency.N != int(w.delivered) || r.FromSend.N != int(w.delivered) || r.Elapsed <= 0 || r.DeliveriesPerSecond() <= 0) {
			t.Errorf("%s: latency %+v from send %+v elapsed %v", r.Scenario.Name, r.Latency, r.FromSend, r.Elapsed)
		}
		// Acks are cumulative every 200 ms, well inside the 1 s re-send
		// delay: nothing may be re-sent.
		if r.Retransmits != 0 {
			t.Errorf("%s: %v retransmits, want 0", r.Scenario.Name, r.Retransmits)
		}
	}
	if !strings.Contains(out.String(), "| delivery | 25 | 12 | 300 (300) |") {
		t.Errorf("report lacks the delivery row:\n%s", out.String())
	}
	// Each scenario's sending window, in order, between its setup and
	// its results.
	var edges strings.Builder
	for _, s := range cfg.Scenarios {
		fmt.Fprintf(&edges, "start %s\nend %s\n", s.Name, s.Name)
	}
	if b, err := os.ReadFile(cfg.WindowFile); err != nil || string(b) != edges.String() {
		t.Errorf("window file = %q (%v), want %q", b, err, edges.String())
	}
}

func TestFanoutScenariosOnline(t *testing.T) {
	all := DefaultFanoutScenarios(3000, 3)
	part := FanoutScenarios(100000, 3000, 3)
	if d := all[len(all)-1]; d.Name != "delivery-3000" || d.Members != 3000 || d.Online != 3000 {
		t.Errorf("all online: %+v", d)
	}
	if d := part[len(part)-1]; d.Name != "delivery-100000-online-3000" || d.Members != 100000 || d.Online != 3000 || d.Procs != 3 {
		t.Errorf("3,000 of 100,000 online: %+v", d)
	}
}

// Pushes of concurrent senders may arrive out of seq order, so the client
// counts a seq it has seen as a re-send, a jump past the contiguous prefix
// as a gap, a late lower seq as a delivery, and only first receipts of
// text messages.
func TestFanoutClientRecordsPushes(t *testing.T) {
	rec := newFanoutRec()
	c := &connSeqs{}
	now := time.UnixMilli(10_000)
	var advanced []bool
	b := rec.begin(now)
	for _, m := range []protocol.Message{
		{ConvID: 7, Seq: 1, Kind: protocol.KindSystem, ServerTime: 9_990},
		{ConvID: 7, Seq: 2, Kind: protocol.KindText, ServerTime: 9_990, Body: stampBody(time.UnixMilli(9_980), 30)},
		{ConvID: 7, Seq: 2, Kind: protocol.KindText, ServerTime: 9_990, Body: stampBody(time.UnixMilli(9_980), 30)}, // re-sent
		{ConvID: 7, Seq: 4, Kind: protocol.KindText, ServerTime: 9_997},                                             // 3 skipped
		{ConvID: 7, Seq: 3, Kind: protocol.KindText, ServerTime: 9_995},                                             // late, not lost
		{ConvID: 7, Seq: 3, Kind: protocol.KindText, ServerTime: 9_995},                                             // re-sent
		{ConvID: 8, Seq: 1, Kind: protocol.KindText, ServerTime: 10_002},                                            // clock step
	} {
		// Through the wire format, as the client reads it.
		data, err := json.Marshal(protocol.Frame{Type: protocol.TypeMsg, Message: &m})
		if err != nil {
			t.Fatal(err)
		}
		p, isMsg, ok := parsePush(data)
		if !ok || !isMsg {
			t.Fatalf("parsePush(%s) = %v, %v", data, isMsg, ok)
		}
		advanced = append(advanced, b.push(c, p))
	}
	rec.end(&b)
	r := rec.report()
	slices.SortFunc(r.Counts, func(a, b SeqCount) int { return cmpUint(a.Conv*100+a.Seq, b.Conv*100+b.Seq) })
	wantCounts := []SeqCount{{Conv: 7, Seq: 2, N: 1}, {Conv: 7, Seq: 3, N: 1}, {Conv: 7, Seq: 4, N: 1}, {Conv: 8, Seq: 1, N: 1}}
	if !reflect.DeepEqual(r.Counts, wantCounts) {
		t.Errorf("counts %v, want %v", r.Counts, wantCounts)
	}
	if r.Dups != 2 || r.Gaps != 1 {
		t.Errorf("dups %d gaps %d, want 2 and 1", r.Dups, r.Gaps)
	}
	if want := (Histogram{10: 1, 5: 1, 3: 1, 0: 1}); !reflect.DeepEqual(r.Latency, want) {
		t.Errorf("latency %v, want %v", r.Latency, want)
	}
	if want := (Histogram{20: 1}); !reflect.DeepEqual(r.FromSend, want) {
		t.Errorf("from send %v, want %v (only stamped bodies count)", r.FromSend, want)
	}
	if r.FirstNS != now.UnixNano() || r.LastNS != now.UnixNano() {
		t.Errorf("first/last %d/%d, want %d", r.FirstNS, r.LastNS, now.UnixNano())
	}
	// An ack is due when the contiguous prefix moves: 1, 2, then 4 only
	// once 3 arrived, then the new conversation.
	if want := []bool{true, true, false, false, true, false, true}; !reflect.DeepEqual(advanced, want) {
		t.Errorf("advanced %v, want %v", advanced, want)
	}
	if c.conv != 8 || c.contig != 1 {
		t.Errorf("prefix (%d, %d), want (8, 1)", c.conv, c.contig)
	}
}
