package bench

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

const testKey = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

func TestParseClusterTarget(t *testing.T) {
	tests := []struct {
		name, urls, key, chats string
		wantGW, wantURLs       []string
		wantChats              []string
		wantErr                string
	}{
		{name: "ws urls", urls: "ws://127.0.0.1:1, ws://127.0.0.1:2", key: testKey, chats: "127.0.0.1:3",
			wantGW: []string{"127.0.0.1:1", "127.0.0.1:2"}, wantURLs: []string{"ws://127.0.0.1:1", "ws://127.0.0.1:2"},
			wantChats: []string{"127.0.0.1:3"}},
		{name: "bare host:port", urls: "h:1", key: testKey,
			wantGW: []string{"h:1"}, wantURLs: []string{"ws://h:1"}},
		{name: "no gateways", urls: " , ", key: testKey, wantErr: "no gateways"},
		{name: "wss refused", urls: "wss://h:1", key: testKey, wantErr: "only ws://"},
		{name: "no port", urls: "ws://h", key: testKey, wantErr: "missing port"},
		{name: "bad chat", urls: "h:1", key: testKey, chats: "c", wantErr: "chat"},
		{name: "short key", urls: "h:1", key: "00ff", wantErr: "key"},
		{name: "not hex", urls: "h:1", key: "zz", wantErr: "key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseClusterTarget(tt.urls, tt.key, tt.chats)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Gateways, tt.wantGW) || !slices.Equal(got.URLs, tt.wantURLs) || !slices.Equal(got.Chats, tt.wantChats) {
				t.Fatalf("got gateways %v urls %v chats %v, want %v %v %v", got.Gateways, got.URLs, got.Chats, tt.wantGW, tt.wantURLs, tt.wantChats)
			}
			if len(got.Key) != 32 {
				t.Fatalf("key is %d bytes, want 32", len(got.Key))
			}
		})
	}
}

func TestStormReportRoundTripAndMerge(t *testing.T) {
	a := StormReport{Clients: 2, Connected: 2, MinConnects: 3, Texts: map[int]int{5: 2}, Resync: Histogram{10: 1, 20: 1}}
	b := StormReport{Clients: 3, Connected: 2, MinConnects: 1, Texts: map[int]int{5: 1, 4: 2}, Dups: 1, Stopped: 1,
		Errors: []string{"boom"}, Resync: Histogram{20: 2}}
	var got []StormReport
	for _, r := range []StormReport{a, b} {
		raw, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ParseStormReport(respReport + " " + string(raw))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p)
	}
	m := MergeStormReports(got)
	if m.Clients != 5 || m.Connected != 4 || m.MinConnects != 1 || m.Dups != 1 || m.Stopped != 1 || len(m.Errors) != 1 {
		t.Fatalf("merged %+v", m)
	}
	if m.Texts[5] != 3 || m.Texts[4] != 2 || len(m.Texts) != 2 {
		t.Fatalf("texts %v, want map[4:2 5:3]", m.Texts)
	}
	if l := m.Resync.Summarize(); l.N != 4 || l.P50 != 20*time.Millisecond || l.Max != 20*time.Millisecond {
		t.Fatalf("resync %+v, want 4 samples, p50 and max 20ms", l)
	}
	if _, err := ParseStormReport("ready 3"); err == nil {
		t.Fatal("a ready line parsed as a report")
	}
}

func TestStormAndHistoryConfigValidate(t *testing.T) {
	key := make([]byte, 32)
	sc := DefaultStormClientConfig()
	sc.URLs, sc.Key, sc.Prefix, sc.From, sc.To = []string{"ws://h:1"}, key, "p", 0, 10
	if err := sc.Validate(); err != nil {
		t.Fatalf("valid storm config: %v", err)
	}
	bad := sc
	bad.To, bad.MaxBackoff = 0, time.Millisecond
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "from < to") || !strings.Contains(err.Error(), "backoff") {
		t.Fatalf("err = %v, want both the range and the backoff reported", err)
	}
	hc := DefaultHistoryConfig()
	if err := hc.Validate(); err != nil {
		t.Fatalf("default history config: %v", err)
	}
	hc.Messages = hc.Limit
	if err := hc.Validate(); err == nil {
		t.Fatal("messages < 2 × limit accepted")
	}
}
