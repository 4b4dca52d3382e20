package enginetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/search/opensearch"
)

// OpenSearch returns the configuration of the OpenSearch node at
// $PARLEY_TEST_OPENSEARCH (scripts/engines/opensearch.sh) with an index
// prefix of the test's own, and drops those indexes when the test ends.
// Without $PARLEY_TEST_OPENSEARCH the test skips, under CI=true it fails.
func OpenSearch(t testing.TB) opensearch.Config {
	t.Helper()
	raw := os.Getenv("PARLEY_TEST_OPENSEARCH")
	if raw == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires OpenSearch: PARLEY_TEST_OPENSEARCH is unset (scripts/engines/up.sh start)")
		}
		t.Skip("PARLEY_TEST_OPENSEARCH is unset; run scripts/engines/up.sh start")
	}
	urls, err := search.SplitURLs(raw)
	if err != nil {
		t.Fatalf("PARLEY_TEST_OPENSEARCH: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	cfg := opensearch.Config{URLs: urls, Prefix: "parleytest-" + hex.EncodeToString(b[:])}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := opensearch.Drop(ctx, cfg); err != nil {
			t.Logf("OpenSearch cleanup: %v", err)
		}
	})
	return cfg
}
