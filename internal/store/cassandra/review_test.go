package cassandra

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/store"
)

// TestBodiesAcrossBucketsFit: the bodies of one owned batch may fall in
// several messages partitions (a batch crossing a bucket boundary); their
// group-committed writes must stay under Cassandra's
// batch_size_fail_threshold (50 KiB by default), which applies to every
// batch of more than one partition, however the bodies are grouped.
func TestBodiesAcrossBucketsFit(t *testing.T) {
	s := openT(t, fresh(t))
	body := strings.Repeat("b", maxGroupBytes/4-400) // each small enough to be group-committed
	hour := time.Hour.Milliseconds()
	var msgs []store.Message
	for i := range 16 {
		msgs = append(msgs, store.Message{ConvID: 77, MsgID: uint64(1000 + i), Sender: "alice", SenderDevice: "d",
			ClientMsgID: "c", Kind: "text", Body: body, ServerTime: int64(1+i/2) * hour})
	}
	if err := s.insertBodies(context.Background(), msgs); err != nil {
		t.Fatalf("insertBodies of %d bodies of %d bytes over %d buckets: %v", len(msgs), len(body), 8, err)
	}
	for _, m := range msgs {
		var got string
		if err := s.q(context.Background(), `SELECT body FROM messages WHERE conv_id = ? AND bucket = ? AND message_id = ?`,
			i64(m.ConvID), s.bucketOf(m.ServerTime), i64(m.MsgID)).Scan(&got); err != nil || got != body {
			t.Fatalf("body %d: %v (%d bytes)", m.MsgID, err, len(got))
		}
	}
}
