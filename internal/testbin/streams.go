package testbin

import (
	"context"
	"strings"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DropStreams deletes the JetStream streams a cluster namespace created
// (tasks, webhooks and their dead-letter streams, all named after the
// upper-cased namespace, and the lease bucket's KV_ stream). Streams left behind by many runs make the shared
// test server restore thousands of them at its next start.
func DropStreams(t testing.TB, url, namespace string) {
	t.Helper()
	prefix := strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(namespace)) + "_"
	nc, err := natsio.Connect(url, natsio.Timeout(5*time.Second))
	if err != nil {
		t.Logf("drop streams %s*: %v", prefix, err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Logf("drop streams %s*: %v", prefix, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	var drop []string
	for name := range names.Name() {
		if strings.HasPrefix(name, prefix) || strings.HasPrefix(name, "KV_"+prefix) {
			drop = append(drop, name)
		}
	}
	if err := names.Err(); err != nil {
		t.Logf("drop streams %s*: list: %v", prefix, err)
	}
	for _, name := range drop {
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Logf("drop stream %s: %v", name, err)
		}
	}
}
