package gateway

import (
	"os/exec"
	"strings"
	"testing"
)

// TestGatewayDoesNotDependOnChat: the gateway is transport; it reaches
// the chat logic only through the Backend interface (docs/architecture.md),
// so neither it nor anything it imports may import internal/chat.
func TestGatewayDoesNotDependOnChat(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "github.com/parley-im/parley/internal/chat" || strings.HasPrefix(p, "github.com/parley-im/parley/internal/chat/") {
			t.Fatalf("the gateway depends on %s", p)
		}
	}
}
