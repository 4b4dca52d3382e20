package metrics

import (
	"encoding/json"
	"os"
	"slices"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/parley-im/parley/internal/buildinfo"
	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/protocol"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func seriesCount(t *testing.T, c prometheus.Collector) int {
	t.Helper()
	ch := make(chan prometheus.Metric, 1024)
	c.Collect(ch)
	close(ch)
	return len(ch)
}

func TestNewRegistersAndGathers(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.Connections.Inc()
	m.Handshakes.WithLabelValues(ResultOK).Inc()
	m.FrameIn("send")
	m.Errors.WithLabelValues("bad_frame").Inc()
	m.Stored.Inc()
	m.SendAck.Observe(0.002)
	m.Delivery.Observe(0.02)
	m.Pushes.Inc()
	m.Retransmits.Inc()
	m.QueueDrops.WithLabelValues(ReasonSlowConsumer).Inc()
	m.SnapshotConv.Observe(12)
	m.StoreErrors.WithLabelValues("Append").Inc()

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{
		"parley_connections", "parley_handshakes_total", "parley_frames_in_total",
		"parley_errors_total", "parley_messages_stored_total", "parley_send_ack_seconds",
		"parley_delivery_seconds", "parley_pushes_total", "parley_retransmits_total",
		"parley_queue_drops_total", "parley_snapshot_convs", "parley_store_errors_total",
	} {
		if !got[name] {
			t.Errorf("metric %s not gathered", name)
		}
	}
	if n := counterValue(t, m.FramesIn.WithLabelValues("send")); n != 1 {
		t.Errorf("frames_in{type=send} = %v, want 1", n)
	}
}

func TestFrameInUnknownTypesShareOneSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	before := seriesCount(t, m.FramesIn)
	for _, typ := range []string{"x", "y", "hello", ""} {
		m.FrameIn(typ)
	}
	if after := seriesCount(t, m.FramesIn); after != before {
		t.Errorf("series %d → %d: unknown types created series", before, after)
	}
	if n := counterValue(t, m.FramesIn.WithLabelValues(frameUnknown)); n != 4 {
		t.Errorf("frames_in{type=unknown} = %v, want 4", n)
	}
}

// TestFrameInCountsEveryClientType: each frame a client may send has its
// own series (conv_mute, search and upload_part are not "unknown").
func TestFrameInCountsEveryClientType(t *testing.T) {
	m := New(prometheus.NewRegistry())
	for _, typ := range protocol.ClientTypes {
		m.FrameIn(typ)
		if n := counterValue(t, m.FramesIn.WithLabelValues(typ)); n != 1 {
			t.Errorf("frames_in{type=%q} = %v, want 1", typ, n)
		}
	}
	if n := counterValue(t, m.FramesIn.WithLabelValues(frameUnknown)); n != 0 {
		t.Errorf("frames_in{type=unknown} = %v, want 0", n)
	}
}

func TestTwoNodesInOneProcess(t *testing.T) {
	// Each server gets its own registry; New must not touch the global one.
	New(prometheus.NewRegistry())
	New(prometheus.NewRegistry())
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "parley_connections" {
			t.Fatal("New registered on the default registry")
		}
	}
}

func TestDoubleRegisterPanics(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg)
	defer func() {
		if recover() == nil {
			t.Fatal("second New on one registry did not panic")
		}
	}()
	New(reg)
}

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	New(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "parley_build_info" {
			continue
		}
		if len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Fatalf("parley_build_info = %v", mf.GetMetric())
		}
		labels := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		want := buildinfo.Get()
		if labels["version"] != want.Version || labels["commit"] != want.Commit || labels["go"] != want.Go {
			t.Fatalf("labels %v, want %+v", labels, want)
		}
		return
	}
	t.Fatal("parley_build_info not gathered")
}

// TestLabelSetsMatchTheirSources: the label values created up front are the
// ones the ledger and the gateway use.
func TestLabelSetsMatchTheirSources(t *testing.T) {
	if len(compensationKinds) != 2 || compensationKinds[0] != ledger.KindRows || compensationKinds[1] != ledger.KindPush {
		t.Fatalf("compensation kinds %v, want the ledger's", compensationKinds)
	}
	// Every code of the protocol's schema, once.
	b, err := os.ReadFile("../../protocol/schema/frames.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]struct {
			Enum []string `json:"enum"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	want := schema.Defs["Code"].Enum
	var got []string
	for _, c := range errorCodes {
		got = append(got, string(c))
	}
	sort.Strings(want)
	sort.Strings(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("error codes created up front %v, want the schema's %v", got, want)
	}
}
