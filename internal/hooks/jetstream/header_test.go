package jetstream

import (
	"strconv"
	"testing"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/hooks"
	"github.com/parley-im/parley/webhook"
)

func TestHeaderKey(t *testing.T) {
	h := natsio.Header{}
	h.Set(hdrConv, "386123681175511040")
	h.Set(hdrSeq, "42")
	h.Set(hdrType, "1")
	if k, ok := headerKey(h); !ok || k != (hooks.Key{Conv: 386123681175511040, Seq: 42, Type: 1}) {
		t.Fatalf("%+v %v", k, ok)
	}
	for _, bad := range [][3]string{
		{"", "1", "0"}, {"1", "x", "0"}, {"1", "1", "-1"}, {"1", "1", strconv.Itoa(len(webhook.Types))}, {"-1", "1", "0"},
	} {
		h := natsio.Header{}
		h.Set(hdrConv, bad[0])
		h.Set(hdrSeq, bad[1])
		h.Set(hdrType, bad[2])
		if k, ok := headerKey(h); ok {
			t.Errorf("%v accepted as %+v", bad, k)
		}
	}
}

// FuzzHeaderKey: the queued event's key decoder never panics and accepts
// only a known type.
func FuzzHeaderKey(f *testing.F) {
	f.Add("1", "2", "0")
	f.Add("18446744073709551615", "0", "7")
	f.Fuzz(func(t *testing.T, conv, seq, typ string) {
		h := natsio.Header{}
		h.Set(hdrConv, conv)
		h.Set(hdrSeq, seq)
		h.Set(hdrType, typ)
		if k, ok := headerKey(h); ok && int(k.Type) >= len(webhook.Types) {
			t.Fatalf("type %d accepted", k.Type)
		}
	})
}
