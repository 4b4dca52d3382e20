package push

import (
	"time"

	"github.com/parley-im/parley/internal/settings"
)

// Preview policies (as for webhooks' recipient.offline).
const (
	PreviewNone   = "none"
	PreviewSender = "sender"
	PreviewFull   = "full"
)

// Config is the push section of the server's configuration. The pusher
// runs when at least one provider is configured.
type Config struct {
	Preview string `yaml:"preview" help:"what a notification shows of a plain conversation's message: none (a count), sender, or full (sender and text); never anything of an end-to-end encrypted one"`
	// Burst is how long an event waits before it is due: a
	// conversation's messages within it make one notification.
	Burst time.Duration `yaml:"burst" help:"how long a notification waits for more messages of its conversation, which it then stands for (with their count)"`
	// CollapseMax bounds collapsing under a steady flood: a conversation
	// gets a notification at least this often.
	CollapseMax time.Duration `yaml:"collapse_max" help:"a conversation flooded without pause still gets a notification this often"`
	MaxAttempts int           `yaml:"max_attempts" help:"attempts per notification before it becomes a dead letter"`
	MinBackoff  time.Duration `yaml:"min_backoff" help:"wait after a notification's first failed attempt, doubling per attempt (a provider's Retry-After, if longer, wins)"`
	MaxBackoff  time.Duration `yaml:"max_backoff" help:"longest wait between two attempts of a notification"`
	Concurrency int           `yaml:"concurrency" help:"conversations whose notifications are sent at once"`
	Timeout     time.Duration `yaml:"timeout" help:"time for one provider request"`
	// DeviceRate notifications per DeviceInterval at most go to one
	// device (registration); the excess is held and coalesced into the
	// device's next notification.
	DeviceRate     int           `yaml:"device_rate" help:"notifications one device gets per device_interval at most; the excess is held and sent as one (its coalesced count) once the device has room"`
	DeviceInterval time.Duration `yaml:"device_interval" help:"the interval of device_rate"`

	APNs    APNsConfig    `yaml:"apns"`
	FCM     FCMConfig     `yaml:"fcm"`
	WebPush WebPushConfig `yaml:"webpush"`
}

// APNsConfig: token authentication with a .p8 key.
type APNsConfig struct {
	KeyFile    string `yaml:"key_file" help:"APNs auth key (.p8, PEM PKCS #8 P-256) from the Apple developer account; empty: no APNs"`
	KeyID      string `yaml:"key_id" help:"the APNs key's id (the JWT's kid)"`
	TeamID     string `yaml:"team_id" help:"the Apple developer team id (the JWT's iss)"`
	URL        string `yaml:"url" help:"APNs production server"`
	SandboxURL string `yaml:"sandbox_url" help:"APNs development server (registrations with sandbox: true)"`
}

// FCMConfig: HTTP v1 with a service account.
type FCMConfig struct {
	CredentialsFile string `yaml:"credentials_file" help:"Firebase service account JSON (client_email, private_key, token_uri, project_id); empty: no FCM"`
	ProjectID       string `yaml:"project_id" help:"Firebase project id (empty: the service account's)"`
	URL             string `yaml:"url" help:"FCM HTTP v1 server"`
}

// WebPushConfig: VAPID.
type WebPushConfig struct {
	VAPIDKeyFile string `yaml:"vapid_key_file" help:"VAPID private key (PEM, P-256); its public key is the page's applicationServerKey; empty: no Web Push"`
	Subject      string `yaml:"subject" help:"VAPID subject: a mailto: or https: contact for push services"`
}

// Defaults.
const (
	DefaultAPNsURL        = "https://api.push.apple.com"
	DefaultAPNsSandboxURL = "https://api.sandbox.push.apple.com"
	DefaultFCMURL         = "https://fcm.googleapis.com"
)

// DefaultConfig returns the defaults (no provider).
func DefaultConfig() Config {
	return Config{
		Preview: PreviewNone, Burst: 250 * time.Millisecond, CollapseMax: 5 * time.Second,
		MaxAttempts: 10, MinBackoff: time.Second, MaxBackoff: 5 * time.Minute, Concurrency: 64, Timeout: 10 * time.Second,
		DeviceRate: 20, DeviceInterval: time.Minute,
		APNs: APNsConfig{URL: DefaultAPNsURL, SandboxURL: DefaultAPNsSandboxURL},
		FCM:  FCMConfig{URL: DefaultFCMURL},
	}
}

// Enabled reports whether a provider is configured.
func (c Config) Enabled() bool {
	return c.APNs.KeyFile != "" || c.FCM.CredentialsFile != "" || c.WebPush.VAPIDKeyFile != ""
}

// Validate reports every problem of c by key.
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.Preview == PreviewNone || c.Preview == PreviewSender || c.Preview == PreviewFull, "preview", "%q is not none, sender or full", c.Preview)
	p.Check(c.Burst >= 0 && c.Burst <= time.Minute, "burst", "must be within 0-1m, got %v", c.Burst)
	p.Check(c.CollapseMax >= c.Burst, "collapse_max", "must be at least burst (%v), got %v", c.Burst, c.CollapseMax)
	p.Check(c.MaxAttempts >= 1, "max_attempts", "must be at least 1, got %d", c.MaxAttempts)
	p.Check(c.MinBackoff > 0, "min_backoff", "must be positive, got %v", c.MinBackoff)
	p.Check(c.MaxBackoff >= c.MinBackoff, "max_backoff", "must be at least min_backoff (%v), got %v", c.MinBackoff, c.MaxBackoff)
	p.Check(c.Concurrency >= 1 && c.Concurrency <= 4096, "concurrency", "must be within 1-4096, got %d", c.Concurrency)
	p.Check(c.Timeout > 0, "timeout", "must be positive, got %v", c.Timeout)
	p.Check(c.DeviceRate >= 1 && c.DeviceRate <= 10000, "device_rate", "must be within 1-10000, got %d", c.DeviceRate)
	p.Check(c.DeviceInterval >= time.Second && c.DeviceInterval <= 24*time.Hour, "device_interval", "must be within 1s-24h, got %v", c.DeviceInterval)
	if c.APNs.KeyFile != "" {
		p.Check(c.APNs.KeyID != "" && c.APNs.TeamID != "", "apns", "key_id and team_id are required with key_file")
		p.Check(c.APNs.URL != "" && c.APNs.SandboxURL != "", "apns.url", "url and sandbox_url are required")
	}
	if c.FCM.CredentialsFile != "" {
		p.Check(c.FCM.URL != "", "fcm.url", "is required")
	}
	if c.WebPush.VAPIDKeyFile != "" {
		p.Check(c.WebPush.Subject != "", "webpush.subject", "is required with vapid_key_file (mailto: or https:)")
	}
	return p.Err("push")
}
