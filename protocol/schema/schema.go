// Package schema holds the machine-readable form of docs/protocol.md: a JSON
// Schema (2020-12) of every frame (frames.json) and an OpenAPI 3.1 document
// of the HTTP endpoints (openapi.json), and validates JSON against them.
// The end-to-end tests validate every frame and HTTP answer the server sends,
// so the schema cannot drift from the server; the TypeScript SDK's frame
// types are generated from frames.json.
//
// Validators are safe for concurrent use.
package schema

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// FramesJSON is frames.json; OpenAPIJSON is openapi.json; AdminOpenAPIJSON
// is admin-openapi.json (the server API, docs/admin.md).
var (
	//go:embed frames.json
	FramesJSON []byte
	//go:embed openapi.json
	OpenAPIJSON []byte
	//go:embed admin-openapi.json
	AdminOpenAPIJSON []byte
)

const (
	framesURL  = "file:///parley/frames.json"
	openapiURL = "file:///parley/openapi.json"
	adminURL   = "file:///parley/admin-openapi.json"
)

var (
	compileOnce sync.Once
	compiler    *jsonschema.Compiler
	compileErr  error
	cacheMu     sync.Mutex
	cache       = map[string]*jsonschema.Schema{}
)

func load() (*jsonschema.Compiler, error) {
	compileOnce.Do(func() {
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		for url, data := range map[string][]byte{framesURL: FramesJSON, openapiURL: OpenAPIJSON, adminURL: AdminOpenAPIJSON} {
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
			if err != nil {
				compileErr = fmt.Errorf("schema: %s: %w", url, err)
				return
			}
			if err := c.AddResource(url, doc); err != nil {
				compileErr = fmt.Errorf("schema: %s: %w", url, err)
				return
			}
		}
		compiler = c
	})
	return compiler, compileErr
}

// compile returns the schema at url#pointer, compiled once.
func compile(loc string) (*jsonschema.Schema, error) {
	c, err := load()
	if err != nil {
		return nil, err
	}
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if s, ok := cache[loc]; ok {
		return s, nil
	}
	s, err := c.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("schema: compile %s: %w", loc, err)
	}
	cache[loc] = s
	return s, nil
}

func validate(loc string, data []byte) error {
	s, err := compile(loc)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("schema: not JSON: %w", err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("schema: %s: %w", loc, err)
	}
	return nil
}

// ServerFrame validates one frame the server sent.
func ServerFrame(data []byte) error { return validateFrame("ServerFrame", data) }

// ClientFrame validates one frame a client sends.
func ClientFrame(data []byte) error { return validateFrame("ClientFrame", data) }

var (
	branchOnce sync.Once
	branches   map[string]map[string]string // union → frame type → its $defs entry
)

// validateFrame validates data against the union's branch for its type
// (the same verdict as the oneOf, without evaluating every branch: the
// e2e tests validate every frame, so this is on their read path). A frame
// whose type names no branch is validated against the whole union, which
// fails with every branch's complaint.
func validateFrame(union string, data []byte) error {
	branchOnce.Do(loadBranches)
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &head) == nil {
		if name, ok := branches[union][head.Type]; ok {
			return validate(framesURL+"#/$defs/"+name, data)
		}
	}
	return validate(framesURL+"#/$defs/"+union, data)
}

// loadBranches reads each union's branches (frame type → $defs name).
func loadBranches() {
	var doc struct {
		Defs map[string]struct {
			OneOf []struct {
				Ref string `json:"$ref"`
			} `json:"oneOf"`
			Properties struct {
				Type struct {
					Const string `json:"const"`
				} `json:"type"`
			} `json:"properties"`
		} `json:"$defs"`
	}
	branches = map[string]map[string]string{}
	if json.Unmarshal(FramesJSON, &doc) != nil {
		return
	}
	for _, u := range []string{"ServerFrame", "ClientFrame"} {
		branches[u] = map[string]string{}
		for _, r := range doc.Defs[u].OneOf {
			name := strings.TrimPrefix(r.Ref, "#/$defs/")
			if t := doc.Defs[name].Properties.Type.Const; t != "" {
				branches[u][t] = name
			}
		}
	}
}

// ClientTypes lists the frame types of the ClientFrame union, sorted.
func ClientTypes() []string {
	branchOnce.Do(loadBranches)
	return slices.Sorted(maps.Keys(branches["ClientFrame"]))
}

// Def validates data against frames.json's $defs/name.
func Def(name string, data []byte) error { return validate(framesURL+"#/$defs/"+name, data) }

// HTTPAnswer validates an HTTP answer's body against the OpenAPI document:
// the schema of method path's response for status and the body's media type.
// An answer the document does not list (path, method, status or media type)
// is an error.
func HTTPAnswer(method, path string, status int, contentType string, body []byte) error {
	if tmpl, ok := pathTemplate(OpenAPIJSON, path); ok {
		path = tmpl
	}
	return answer(openapiURL, "openapi.json", method, path, status, contentType, body)
}

// AdminAnswer validates an answer of the server API against
// admin-openapi.json; path is the request's path, matched against the
// document's path templates.
func AdminAnswer(method, path string, status int, contentType string, body []byte) error {
	tmpl, ok := pathTemplate(AdminOpenAPIJSON, path)
	if !ok || !slices.Contains(AdminOperations(), strings.ToUpper(method)+" "+tmpl) {
		// Any other path or method: 404 with the error body.
		if status != http.StatusNotFound {
			return fmt.Errorf("schema: %s %s is no operation of admin-openapi.json, answered %d", method, path, status)
		}
		return validate(adminURL+"#/components/schemas/Error", body)
	}
	return answer(adminURL, "admin-openapi.json", method, tmpl, status, contentType, body)
}

// AdminOperations lists the server API's operations as "METHOD template".
func AdminOperations() []string { return operations(AdminOpenAPIJSON) }

// operations lists an OpenAPI document's operations as "METHOD template".
func operations(openapi []byte) []string {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if json.Unmarshal(openapi, &doc) != nil {
		return nil
	}
	var out []string
	for p, ops := range doc.Paths {
		for m := range ops {
			out = append(out, strings.ToUpper(m)+" "+p)
		}
	}
	return out
}

// pathTemplate finds the OpenAPI document's path template that path
// instantiates (a literal segment beats a parameter).
func pathTemplate(openapi []byte, path string) (string, bool) {
	segs := strings.Split(path, "/")
	best, bestLit := "", -1
	seen := map[string]bool{}
	for _, op := range operations(openapi) {
		_, tmpl, _ := strings.Cut(op, " ")
		if seen[tmpl] {
			continue
		}
		seen[tmpl] = true
		ts := strings.Split(tmpl, "/")
		if len(ts) != len(segs) {
			continue
		}
		lit, ok := 0, true
		for i, t := range ts {
			switch {
			case strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}"):
				ok = ok && segs[i] != ""
			case t == segs[i]:
				lit++
			default:
				ok = false
			}
		}
		if ok && lit > bestLit {
			best, bestLit = tmpl, lit
		}
	}
	return best, bestLit >= 0
}

func answer(docURL, docName, method, path string, status int, contentType string, body []byte) error {
	openapiURL := docURL
	op := "/paths/" + escape(path) + "/" + strings.ToLower(method)
	media, _, _ := strings.Cut(contentType, ";")
	media = strings.TrimSpace(media)
	resp := op + "/responses/" + strconv.Itoa(status)
	if status == http.StatusSwitchingProtocols {
		return nil
	}
	if media == "" && len(body) == 0 {
		return nil
	}
	loc := openapiURL + "#" + resp + "/content/" + escape(media) + "/schema"
	if _, err := compile(loc); err != nil {
		// A media type range ("audio/*", "*/*") documents every type it
		// covers (the file downloads).
		major, _, _ := strings.Cut(media, "/")
		found := false
		for _, r := range []string{major + "/*", "*/*"} {
			if _, rerr := compile(openapiURL + "#" + resp + "/content/" + escape(r) + "/schema"); rerr == nil {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("schema: %s %s answered %d %s, which %s does not document: %w", method, path, status, media, docName, err)
		}
	}
	if media != "application/json" {
		return nil
	}
	return validate(loc, body)
}

// escape encodes s as one JSON pointer token inside a URL fragment.
func escape(s string) string {
	s = strings.ReplaceAll(s, "~", "~0")
	s = strings.ReplaceAll(s, "/", "~1")
	return s
}
