package bench

import (
	"reflect"
	"testing"

	"github.com/parley-im/parley/internal/config"
)

// TestUnthrottledAsEnvMatchesFlags: the variables StartServer sets give
// the server the same settings as the Unthrottled flags would.
func TestUnthrottledAsEnvMatchesFlags(t *testing.T) {
	byFlags, err := config.Load(Unthrottled, nil)
	if err != nil {
		t.Fatal(err)
	}
	byEnv, err := config.Load(nil, flagsAsEnv(Unthrottled))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(byFlags, byEnv) {
		t.Fatalf("settings differ:\nflags %+v\nenv   %+v", byFlags, byEnv)
	}
	if reflect.DeepEqual(byEnv, mustDefaults(t)) {
		t.Fatal("the variables changed nothing")
	}
}

func mustDefaults(t *testing.T) config.Config {
	c, err := config.Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
