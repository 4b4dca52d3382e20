package memory

import (
	"testing"

	"github.com/parley-im/parley/internal/registry"
	"github.com/parley-im/parley/internal/registry/registrytest"
)

func TestConformance(t *testing.T) {
	registrytest.Run(t, func(*testing.T) registry.Registry { return New() })
}
