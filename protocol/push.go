package protocol

import (
	"crypto/ecdh"
	"encoding/base64"
	"net/url"
)

// Push registration frames (docs/protocol.md, "Push notifications"): a
// device registers the token a push provider wakes it by, so that a
// message arriving while none of its user's devices is connected reaches
// it as a notification. Registering again refreshes (a provider may rotate
// the token: register the new one, remove the old).

// Client frames of push registrations.
const (
	TypePushRegister = "push_register" // register (or refresh) one of this device's tokens; answered by push
	TypePushRemove   = "push_remove"   // remove one, or every, of this device's tokens; answered by push
)

// TypePush answers push_register and push_remove: this device's
// registrations after the change.
const TypePush = "push"

// Push providers.
const (
	PushAPNs    = "apns"    // Apple Push Notification service (token: the device token, hex)
	PushFCM     = "fcm"     // Firebase Cloud Messaging (token: the registration token)
	PushWebPush = "webpush" // Web Push (RFC 8030): endpoint, p256dh and auth of the browser's PushSubscription
)

// CodeTooManyRegistrations: the device holds the most push registrations
// already (remove one first).
const CodeTooManyRegistrations Code = "too_many_registrations"

// Bounds of a registration.
const (
	MaxPushTokenBytes = 4096 // a token or Web Push endpoint URL
	MaxPushTopicBytes = 255  // an APNs topic (bundle id)
	PushP256dhBytes   = 65   // an uncompressed P-256 point
	PushAuthBytes     = 16   // the Web Push authentication secret
)

// PushRegistration is a device's registration with one provider. p256dh
// and auth are base64url (padded or not), as PushSubscription.toJSON()
// gives them.
type PushRegistration struct {
	Provider string `json:"provider"`
	Token    string `json:"token,omitempty"`    // apns, fcm
	Topic    string `json:"topic,omitempty"`    // apns: the app's bundle id
	Sandbox  bool   `json:"sandbox,omitempty"`  // apns: the development environment
	Endpoint string `json:"endpoint,omitempty"` // webpush
	P256dh   string `json:"p256dh,omitempty"`   // webpush
	Auth     string `json:"auth,omitempty"`     // webpush
	// UpdatedAt (answers only) is when it was last registered.
	UpdatedAt int64 `json:"updated_at,omitempty"`
}

// Key is the registration's token: the endpoint of a Web Push one.
func (r *PushRegistration) Key() string {
	if r.Provider == PushWebPush {
		return r.Endpoint
	}
	return r.Token
}

// ValidPushProvider reports whether p names a provider.
func ValidPushProvider(p string) bool { return p == PushAPNs || p == PushFCM || p == PushWebPush }

// ValidPushToken reports whether t is 1..MaxPushTokenBytes bytes of
// printable ASCII without spaces.
func ValidPushToken(t string) bool {
	if len(t) == 0 || len(t) > MaxPushTokenBytes {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return false
		}
	}
	return true
}

// DecodeB64URL decodes base64url with or without padding.
func DecodeB64URL(s string) ([]byte, error) {
	if n := len(s); n > 0 && s[n-1] == '=' {
		return base64.URLEncoding.DecodeString(s)
	}
	return base64.RawURLEncoding.DecodeString(s)
}

// WebPushKeys decodes and checks a Web Push registration's keys.
func (r *PushRegistration) WebPushKeys() (p256dh, auth []byte, e *Error) {
	p256dh, err := DecodeB64URL(r.P256dh)
	if err != nil || len(p256dh) != PushP256dhBytes {
		return nil, nil, Errorf(CodeInvalidArgument, "p256dh must be an uncompressed P-256 point (%d bytes, base64url)", PushP256dhBytes)
	}
	if _, err := ecdh.P256().NewPublicKey(p256dh); err != nil {
		return nil, nil, Errorf(CodeInvalidArgument, "p256dh is not a point of P-256")
	}
	auth, err = DecodeB64URL(r.Auth)
	if err != nil || len(auth) != PushAuthBytes {
		return nil, nil, Errorf(CodeInvalidArgument, "auth must be %d bytes, base64url", PushAuthBytes)
	}
	return p256dh, auth, nil
}

func validatePush(f *Frame) *Error {
	r := f.Push
	if r == nil {
		if f.Type == TypePushRemove {
			return nil // every registration of the device
		}
		return Errorf(CodeInvalidArgument, "push is required")
	}
	if !ValidPushProvider(r.Provider) {
		return Errorf(CodeInvalidArgument, "push.provider must be apns, fcm or webpush")
	}
	if r.UpdatedAt != 0 {
		return Errorf(CodeInvalidArgument, "push.updated_at is the server's")
	}
	tokenErr := Errorf(CodeInvalidArgument, "push.token must be 1-%d bytes of printable ASCII without spaces", MaxPushTokenBytes)
	switch r.Provider {
	case PushAPNs, PushFCM:
		if r.Endpoint != "" || r.P256dh != "" || r.Auth != "" {
			return Errorf(CodeInvalidArgument, "endpoint, p256dh and auth are Web Push's")
		}
		if !ValidPushToken(r.Token) {
			return tokenErr
		}
		if r.Provider == PushFCM && (r.Topic != "" || r.Sandbox) {
			return Errorf(CodeInvalidArgument, "topic and sandbox are APNs's")
		}
		if f.Type == TypePushRegister && r.Provider == PushAPNs && (r.Topic == "" || !ValidPushToken(r.Topic) || len(r.Topic) > MaxPushTopicBytes) {
			return Errorf(CodeInvalidArgument, "push.topic (the app's bundle id) must be 1-%d bytes of printable ASCII", MaxPushTopicBytes)
		}
	case PushWebPush:
		if r.Token != "" || r.Topic != "" || r.Sandbox {
			return Errorf(CodeInvalidArgument, "token, topic and sandbox are not Web Push's")
		}
		u, err := url.Parse(r.Endpoint)
		if !ValidPushToken(r.Endpoint) || err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
			return Errorf(CodeInvalidArgument, "push.endpoint must be an https URL of at most %d bytes", MaxPushTokenBytes)
		}
		if f.Type == TypePushRegister {
			if _, _, e := r.WebPushKeys(); e != nil {
				return e
			}
		} else if r.P256dh != "" || r.Auth != "" {
			return Errorf(CodeInvalidArgument, "push_remove names the endpoint only")
		}
	}
	return nil
}
