package client

import (
	"errors"
	"testing"

	"github.com/parley-im/parley/protocol"
)

func TestResolveAttachmentURL(t *testing.T) {
	tests := []struct{ server, raw, want string }{
		{"ws://127.0.0.1:7480", "/v1/uploads/5/parts/1?exp=9&sig=x", "http://127.0.0.1:7480/v1/uploads/5/parts/1?exp=9&sig=x"},
		{"wss://chat.example/v1/ws", "/v1/files/5?conv=1&seq=2", "https://chat.example/v1/files/5?conv=1&seq=2"},
		{"wss://chat.example/v1/ws?x=1", "https://s3.example/bucket/f/5?X-Amz-Signature=abc", "https://s3.example/bucket/f/5?X-Amz-Signature=abc"},
	}
	for _, tc := range tests {
		c, err := New(Config{URL: tc.server, Token: "t", Device: "d"})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.resolve(tc.raw)
		if err != nil || got != tc.want {
			t.Errorf("resolve(%q) against %s = %q, %v; want %q", tc.raw, tc.server, got, err, tc.want)
		}
	}
}

func TestAttachmentSentinels(t *testing.T) {
	for sentinel, code := range codeSentinels {
		err := error(&Error{Code: code, Msg: "x"})
		if !errors.Is(err, sentinel) {
			t.Errorf("errors.Is(%s, %v) = false", code, sentinel)
		}
		if errors.Is(&Error{Code: protocol.CodeInternal}, sentinel) {
			t.Errorf("internal is %v", sentinel)
		}
	}
}
