package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
)

// TestEdgeOversizedRequestsReadTheirAnswer: a client still sending an
// oversized request when the node refuses it — a POST /v1/rpc body of 100×
// max_frame_bytes, a 1 MiB Authorization header — reads the documented
// answer (413, 431 too_large), never a connection reset: the node shuts
// its side down after the answer and drains what the client still sends,
// as net/http does, instead of closing under it. Repeated, because a reset
// depends on timing.
func TestEdgeOversizedRequestsReadTheirAnswer(t *testing.T) {
	// Race builds serve on net/http, which resets a connection whose
	// client still sends after its answer when the drain it allows runs
	// out; the event loop is the server of every other build.
	nbioOnly(t)
	srv := servertest.Start(t)
	url := srv.HTTPURL + "/v1/rpc?device=d"
	body := bytes.Repeat([]byte("x"), 100*protocol.DefaultLimits.MaxFrameBytes)
	for i := range 10 {
		tr := &http.Transport{DisableKeepAlives: true}
		hc := &http.Client{Transport: tr}
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+srv.Token("alice"))
		resp, err := hc.Do(req)
		checkAnswer(t, i, "100× max_frame_bytes body", resp, err, http.StatusRequestEntityTooLarge)

		req, _ = http.NewRequest(http.MethodPost, url, strings.NewReader(`{"type":"ping"}`))
		req.Header.Set("Authorization", "Bearer "+strings.Repeat("x", 1<<20))
		resp, err = hc.Do(req)
		checkAnswer(t, i, "1 MiB Authorization header", resp, err, http.StatusRequestHeaderFieldsTooLarge)
		tr.CloseIdleConnections()
	}
}

func checkAnswer(t *testing.T, i int, what string, resp *http.Response, err error, status int) {
	t.Helper()
	if err != nil {
		t.Fatalf("try %d, %s: %v (want the %d answer)", i, what, err, status)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Code string }
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode != status || e.Code != string(protocol.CodeTooLarge) {
		t.Fatalf("try %d, %s: %d %s, want %d too_large", i, what, resp.StatusCode, b, status)
	}
}
