// Package web holds the web chat page served by `parley serve` at /: the
// committed build output in static/ (index.html, app.css, and the page
// script plus the TypeScript SDK compiled by tsc into static/js). The
// sources are web/src/app.ts and sdk/ts/src; `npm run build` in sdk/ts
// rebuilds static/js, and CI fails when the committed files are stale, so
// `go run ./cmd/parley serve` serves the page with no Node installed.
package web

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Static is the page's files, rooted at static/.
func Static() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}
