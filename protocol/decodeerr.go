package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// decodeError turns a JSON decoding failure into the documented code with
// a message that names the field: bad_frame for JSON that is not valid or
// a field of the wrong JSON type, invalid_argument for a value of the right
// type that is out of range (a negative seq, a fraction, an id that is not
// a decimal number). Go's own messages name Go types and struct fields,
// which mean nothing to a client written from docs/protocol.md.
func decodeError(data []byte, err error) *Error {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return Errorf(CodeBadFrame, "frame is not valid JSON (at byte %d)", syn.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "frame"
		}
		got, _, _ := strings.Cut(te.Value, " ")
		want := jsonKind(te.Type)
		if got == "number" && want == "number" {
			if te.Type.Kind() >= reflect.Uint && te.Type.Kind() <= reflect.Uint64 {
				return Errorf(CodeInvalidArgument, "%s must be an integer from 0 to %d", field, uint64(1<<64-1))
			}
			return Errorf(CodeInvalidArgument, "%s must be an integer in range", field)
		}
		return Errorf(CodeBadFrame, "%s must be %s, not a JSON %s", field, article(want), got)
	}
	// The ids that travel as decimal strings (",string" fields) fail with a
	// message that names neither the field nor the value: find them.
	if e := badDecimalID(data); e != nil {
		return e
	}
	return Errorf(CodeBadFrame, "frame does not decode")
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.String:
		return "string"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "number"
}

func article(kind string) string {
	if kind == "array" || kind == "object" {
		return "an " + kind
	}
	return "a " + kind
}

// decimalIDFields are the fields whose uint64 values travel as decimal
// strings (they exceed 2^53).
var decimalIDFields = []string{"conv_id", "msg_id"}

// badDecimalID finds the decimal-string id of a frame (or of its convs
// list) that is not one.
func badDecimalID(data []byte) *Error {
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) != nil {
		return nil
	}
	if e := checkIDs(top, ""); e != nil {
		return e
	}
	var convs []map[string]json.RawMessage
	if raw, ok := top["convs"]; ok && json.Unmarshal(raw, &convs) == nil {
		for i, c := range convs {
			if e := checkIDs(c, fmt.Sprintf("convs[%d].", i)); e != nil {
				return e
			}
		}
	}
	return nil
}

func checkIDs(obj map[string]json.RawMessage, prefix string) *Error {
	for _, name := range decimalIDFields {
		raw, ok := obj[name]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return Errorf(CodeBadFrame, "%s%s must be a decimal string (ids exceed 2^53), not %s", prefix, name, truncate(string(raw)))
		}
		if _, err := strconv.ParseUint(s, 10, 64); err != nil {
			return Errorf(CodeInvalidArgument, "%s%s %q is not a decimal id from 0 to %d", prefix, name, truncate(s), uint64(1<<64-1))
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}
