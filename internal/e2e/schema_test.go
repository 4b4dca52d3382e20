package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/parley-im/parley/protocol/schema"
)

// TestMain makes every HTTP answer the e2e tests read through
// http.DefaultClient (http.Get included) pass through the OpenAPI document:
// an answer it does not describe fails the test that made the request.
// Frames read by rawConn are validated against frames.json there.
func TestMain(m *testing.M) {
	if role := os.Getenv(floodRoleEnv); role != "" {
		os.Exit(floodChildMain(role)) // this process is a flood test's victim or attacker
	}
	http.DefaultClient.Transport = validating{http.DefaultTransport}
	os.Exit(m.Run())
}

type validating struct{ next http.RoundTripper }

// schemaErr is returned as the request's error, so the test that made the
// request fails at its own err check.
type schemaErr struct{ err error }

func (e schemaErr) Error() string { return e.err.Error() }

func (v validating) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := v.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if verr := schema.HTTPAnswer(r.Method, r.URL.Path, resp.StatusCode, resp.Header.Get("Content-Type"), body); verr != nil {
		return nil, schemaErr{fmt.Errorf("%s %s: %w (body %.300s)", r.Method, r.URL, verr, body)}
	}
	return resp, nil
}

// TestSchemaCatchesDrift: the validating transport refuses an answer the
// OpenAPI document does not describe.
func TestSchemaCatchesDrift(t *testing.T) {
	srv := http.NewServeMux()
	srv.HandleFunc("GET /v1/conversations/snapshot", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"snapshot":null}`))
	})
	ts := newLocalServer(t, srv)
	if _, err := http.Get(ts + "/v1/conversations/snapshot"); err == nil {
		t.Fatal("a null snapshot passed the OpenAPI check")
	}
}

func newLocalServer(t *testing.T, h http.Handler) string {
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}
