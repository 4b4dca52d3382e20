package hooks

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	pnats "github.com/parley-im/parley/internal/bus/nats"
	"github.com/parley-im/parley/internal/settings"
	"github.com/parley-im/parley/webhook"
)

// Preview policies of recipient.offline.
const (
	PreviewNone   = "none"
	PreviewSender = "sender"
	PreviewFull   = "full"
)

// Config is the webhooks section of the server's configuration
// (webhooks.*; package settings). With no endpoints nothing is produced or
// stored. Endpoints are a list, set in the config file only.
type Config struct {
	Endpoints   []Endpoint    `yaml:"endpoints"`
	MaxAttempts int           `yaml:"max_attempts" help:"attempts per webhook event before it becomes a dead letter (endpoints: a list in the config file, docs/webhooks.md)"`
	MinBackoff  time.Duration `yaml:"min_backoff" help:"wait after a webhook event's first failed attempt, doubling per attempt"`
	MaxBackoff  time.Duration `yaml:"max_backoff" help:"longest wait between two attempts of a webhook event"`
}

// Endpoint is one receiver (an item of webhooks.endpoints).
type Endpoint struct {
	// Name identifies the endpoint's queue; renaming it abandons what is
	// queued for the old name.
	Name string `yaml:"name"`
	URL  string `yaml:"url"`
	// Secret (or SecretFile, whose content is trimmed) keys the HMAC.
	Secret     string `yaml:"secret"`
	SecretFile string `yaml:"secret_file"`
	// Events to send (webhook.Types); empty means all.
	Events []string `yaml:"events"`
	// Timeout of one attempt, from connect to the response's status.
	Timeout time.Duration `yaml:"timeout"`
	// Preview of recipient.offline: none, sender or full.
	Preview string `yaml:"preview"`
	// Concurrency is how many conversations are delivered to at once.
	Concurrency int `yaml:"concurrency"`
}

// Defaults.
const (
	DefaultMaxAttempts = 10
	DefaultMinBackoff  = time.Second
	DefaultMaxBackoff  = 5 * time.Minute
	DefaultTimeout     = 5 * time.Second
	DefaultConcurrency = 8
)

// DefaultConfig returns the defaults (no endpoints).
func DefaultConfig() Config {
	return Config{MaxAttempts: DefaultMaxAttempts, MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff}
}

// WithDefaults fills unset fields.
// RedeliverAfter is how long a queue that hands unacknowledged events out
// again (JetStream's ack wait) lets one stay held: twice the longest
// backoff, at least a minute. An event may wait longer, behind its
// conversation's earlier ones; a copy handed out again joins the one held.
func (c Config) RedeliverAfter() time.Duration {
	return max(time.Minute, 2*c.WithDefaults().MaxBackoff)
}

func (c Config) WithDefaults() Config {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	eps := make([]Endpoint, len(c.Endpoints))
	for i, e := range c.Endpoints {
		if e.Timeout == 0 {
			e.Timeout = DefaultTimeout
		}
		if e.Preview == "" {
			e.Preview = PreviewNone
		}
		if e.Concurrency == 0 {
			e.Concurrency = DefaultConcurrency
		}
		if len(e.Events) == 0 {
			e.Events = slices.Clone(webhook.Types)
		}
		eps[i] = e
	}
	c.Endpoints = eps
	return c
}

// Validate reports every problem of c (after WithDefaults) by key.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var p settings.Problems
	p.Check(c.MaxAttempts >= 1, "max_attempts", "must be at least 1, got %d", c.MaxAttempts)
	p.Check(c.MinBackoff > 0, "min_backoff", "must be positive, got %v", c.MinBackoff)
	p.Check(c.MaxBackoff >= c.MinBackoff, "max_backoff", "must be at least min_backoff (%v), got %v", c.MinBackoff, c.MaxBackoff)
	names := map[string]bool{}
	for i, e := range c.Endpoints {
		key := fmt.Sprintf("endpoints[%d]", i)
		p.Check(pnats.ValidName(e.Name), key+".name", "%q must be 1-64 of [A-Za-z0-9_-]", e.Name)
		p.Check(!names[e.Name], key+".name", "%q used twice", e.Name)
		names[e.Name] = true
		u, err := url.Parse(e.URL)
		p.Check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", key+".url", "%q is not an http(s) URL", e.URL)
		p.Check((e.Secret == "") != (e.SecretFile == ""), key, "set exactly one of secret and secret_file")
		for _, ev := range e.Events {
			p.Check(slices.Contains(webhook.Types, ev), key+".events", "unknown event %q (known: %s)", ev, strings.Join(webhook.Types, ", "))
		}
		p.Check(e.Timeout > 0, key+".timeout", "must be positive, got %v", e.Timeout)
		p.Check(e.Preview == PreviewNone || e.Preview == PreviewSender || e.Preview == PreviewFull, key+".preview", "%q is not none, sender or full", e.Preview)
		p.Check(e.Concurrency >= 1 && e.Concurrency <= 1024, key+".concurrency", "must be within 1-1024, got %d", e.Concurrency)
	}
	return p.Err("webhooks")
}

// secret returns the endpoint's HMAC key.
func (e Endpoint) secret() ([]byte, error) {
	if e.SecretFile == "" {
		return []byte(e.Secret), nil
	}
	b, err := os.ReadFile(e.SecretFile)
	if err != nil {
		return nil, fmt.Errorf("webhooks: endpoint %s: %w", e.Name, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil, errors.New("webhooks: endpoint " + e.Name + ": secret file is empty")
	}
	return []byte(s), nil
}
