package local

import (
	"testing"

	"github.com/parley-im/parley/internal/bus"
	"github.com/parley-im/parley/internal/bus/bustest"
)

func TestConformance(t *testing.T) {
	bustest.Run(t, func(*testing.T) bus.Bus { return New() })
}
