package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/parley-im/parley/protocol"
)

// Request bodies. Unknown fields are refused (a misspelt field would
// otherwise be ignored by an operator's script without a word).
type (
	directReq struct {
		Users []string `json:"users"`
		E2E   bool     `json:"e2e"`
	}
	groupReq struct {
		Owner   string   `json:"owner"`
		Name    string   `json:"name"`
		Members []string `json:"members"`
		E2E     bool     `json:"e2e"`
	}
	membersReq struct {
		Users []string `json:"users"`
	}
	roleReq struct {
		Role string `json:"role"`
	}
	muteReq struct {
		Muted *bool `json:"muted"`
	}
	messageReq struct {
		As          string   `json:"as"` // user (default), bot or system
		Sender      string   `json:"sender"`
		Device      string   `json:"device"`
		ClientMsgID string   `json:"client_msg_id"`
		Body        string   `json:"body"`
		Kind        string   `json:"kind"`
		CoalesceKey string   `json:"coalesce_key"`
		Mentions    []string `json:"mentions"`
		MentionAll  bool     `json:"mention_all"`
		Text        string   `json:"text"` // as system
	}
	editReq struct {
		ClientMsgID string `json:"client_msg_id"`
		Body        string `json:"body"`
	}
	banReq struct {
		Reason string `json:"reason"`
	}
	revokeReq struct {
		Before *int64 `json:"before"` // Unix ms; absent: now
		Device string `json:"device"`
	}
	disconnectReq struct {
		Device string `json:"device"`
	}
)

// maxReasonBytes bounds a ban's reason.
const maxReasonBytes = 256

// decode reads a JSON object body into dst. An empty body is an empty
// object. Errors are bad_frame (not JSON, not an object, a field of the
// wrong type, an unknown field) with a message naming the field.
func decode[T any](body []byte, dst *T) *protocol.Error {
	if !utf8.Valid(body) {
		return protocol.Errorf(protocol.CodeBadFrame, "the body is not valid UTF-8")
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		trimmed = []byte("{}")
	}
	if trimmed[0] != '{' {
		return protocol.Errorf(protocol.CodeBadFrame, "the body is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeErr(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return protocol.Errorf(protocol.CodeBadFrame, "the body holds more than one JSON value")
	}
	return nil
}

func decodeErr(err error) *protocol.Error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "the body"
		}
		return protocol.Errorf(protocol.CodeBadFrame, "%s must be %s, not %s", field, jsonKind(te.Type.Kind().String()), te.Value)
	case errors.As(err, &se):
		return protocol.Errorf(protocol.CodeBadFrame, "the body is not valid JSON (at byte %d)", se.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return protocol.Errorf(protocol.CodeBadFrame, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return protocol.Errorf(protocol.CodeBadFrame, "the body is not valid JSON")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "ptr":
		return "a value of its documented type"
	}
	return "a number in range"
}

// validUsers checks a list of user ids.
func validUsers(field string, users []string, max int) *protocol.Error {
	if len(users) > max {
		return protocol.Errorf(protocol.CodeTooLarge, "%s: %d users is over %d", field, len(users), max)
	}
	for i, u := range users {
		if !protocol.ValidID(u) {
			return protocol.Errorf(protocol.CodeInvalidArgument, "%s[%d] %q is not a valid user id", field, i, truncate(u))
		}
	}
	return nil
}
