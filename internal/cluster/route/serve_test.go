package route

import (
	"strings"
	"testing"
	"time"

	natsio "github.com/nats-io/nats.go"

	"github.com/parley-im/parley/internal/chat"
)

func TestServeConfigValidate(t *testing.T) {
	ok := ServeConfig{Conn: &natsio.Conn{}, Namespace: "parley", Service: &chat.Service{}}
	for _, tc := range []struct {
		name string
		edit func(*ServeConfig)
		want []string // substrings of the error; none: valid
	}{
		{"required only", func(*ServeConfig) {}, nil},
		{"all set", func(c *ServeConfig) { c.Timeout, c.MaxInflight = time.Second, 8 }, nil},
		{"zero", func(c *ServeConfig) { *c = ServeConfig{} }, []string{"Conn is required", "Namespace is required", "Service is required"}},
		{"negative timeout", func(c *ServeConfig) { c.Timeout = -time.Second }, []string{"Timeout must not be negative"}},
		{"negative inflight", func(c *ServeConfig) { c.MaxInflight = -1 }, []string{"MaxInflight must not be negative"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestServeConfigDefaults(t *testing.T) {
	got := ServeConfig{}.withDefaults()
	if got.Timeout != DefaultTimeout || got.MaxInflight != DefaultMaxInflight || got.Logger == nil {
		t.Fatalf("withDefaults() = timeout %v, inflight %d, logger %v; want %v, %d, a logger", got.Timeout, got.MaxInflight, got.Logger, DefaultTimeout, DefaultMaxInflight)
	}
	set := ServeConfig{Timeout: time.Second, MaxInflight: 3}.withDefaults()
	if set.Timeout != time.Second || set.MaxInflight != 3 {
		t.Fatalf("withDefaults() changed set fields: timeout %v, inflight %d", set.Timeout, set.MaxInflight)
	}
}
