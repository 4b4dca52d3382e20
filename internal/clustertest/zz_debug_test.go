package clustertest

import (
	"os"
	"strings"
	natsio "github.com/nats-io/nats.go"

	"fmt"
	"testing"
	"time"

	"github.com/parley-im/parley/protocol"
)

func TestZZDebug(t *testing.T) {
	c := Start(t, Options{Gateways: 1, Chats: 1, Extra: []string{"--chat.small-below", "4", "--chat.large-above", "8", "--log.level", "debug"}})
	nc, err := natsio.Connect(os.Getenv("PARLEY_TEST_NATS"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, _ = nc.Subscribe(">", func(m *natsio.Msg) {
		if !strings.Contains(m.Subject, "$JS") && !strings.Contains(m.Subject, "_INBOX") {
			t.Logf("nats %s %.200s", m.Subject, m.Data)
		}
	})
	var conns []*liveConn
	var names []string
	for i := 0; i < 5; i++ {
		names = append(names, fmt.Sprintf("u%d", i))
		conns = append(conns, dialLive(t, c, c.Gateways[0], names[i]))
	}
	time.Sleep(500 * time.Millisecond)
	r := conns[0].call(protocol.Frame{Type: protocol.TypeCreateGroup, Name: "m", Members: names[1:]}, protocol.TypeConv)
	t.Logf("tier %s", r.Conv.Tier)
	for i := 0; i < 3; i++ {
		conns[0].call(protocol.Frame{Type: protocol.TypeSend, ConvID: r.Conv.ConvID, ClientMsgID: fmt.Sprint(i), Body: "x"}, protocol.TypeAck)
	}
	time.Sleep(time.Second)
	t.Log(c.Metrics(c.Chats[0], "parley_fanout"))
	t.Log(c.Log(c.Chats[0]))
}
