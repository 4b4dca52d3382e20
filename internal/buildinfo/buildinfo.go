// Package buildinfo says which build of Parley is running: its version,
// its commit and the Go release that compiled it, for `parley version` and
// the parley_build_info metric.
//
// The version and commit come from -ldflags when given:
//
//	go build -ldflags "-X github.com/parley-im/parley/internal/buildinfo.version=v1.2.0 \
//	  -X github.com/parley-im/parley/internal/buildinfo.commit=$(git rev-parse HEAD)" ./cmd/parley
//
// and otherwise from what the Go toolchain stamps into the binary
// (debug.ReadBuildInfo): the module version of `go install ...@v1.2.0`,
// and the VCS revision of a build inside a git checkout (with "-dirty"
// when the tree had local changes). `go run` and test binaries carry no
// revision: "unknown".
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set with -ldflags -X; empty means read the build information.
var (
	version string
	commit  string
)

// Info describes the running build.
type Info struct {
	Version string // v1.2.0, or "dev"
	Commit  string // full revision, possibly with "-dirty", or "unknown"
	Go      string // go1.26.0
}

// Get returns the running build's description.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(bi, ok, version, commit)
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool, ldVersion, ldCommit string) Info {
	info := Info{Version: ldVersion, Commit: ldCommit, Go: runtime.Version()}
	if ok && bi.GoVersion != "" {
		info.Go = bi.GoVersion
	}
	if ok && info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	if ok && info.Commit == "" {
		var rev string
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" && dirty {
			rev += "-dirty"
		}
		info.Commit = rev
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}
