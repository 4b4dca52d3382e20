package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"},
	}}
	local := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}
	tests := []struct {
		name     string
		bi       *debug.BuildInfo
		ok       bool
		ldV, ldC string
		want     Info
	}{
		{"stamped", stamped, true, "", "", Info{"v1.2.0", "abc123-dirty", "go1.26.0"}},
		{"ldflags win", stamped, true, "v9", "fff", Info{"v9", "fff", "go1.26.0"}},
		{"go run", local, true, "", "", Info{"dev", "unknown", "go1.26.0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fromBuildInfo(tt.bi, tt.ok, tt.ldV, tt.ldC); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if got := fromBuildInfo(nil, false, "", ""); got.Version != "dev" || got.Commit != "unknown" || got.Go == "" {
		t.Fatalf("no build info: %+v", got)
	}
}
