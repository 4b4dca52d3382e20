package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/parley-im/parley/internal/snowflake"
)

// Snowflake node numbers of chat processes are leased in Redis, so no two
// live processes mint message ids with the same node number: the key
// <ns>:snowflake:<n> holds the node name with a TTL, renewed every third
// of it. A configured number that another live node holds refuses the
// start; without one, the process takes the first free number from the
// hash of its name on.

// NodeNumberTTL is the TTL of a node number lease.
const NodeNumberTTL = 30 * time.Second

// ErrNodeNumberTaken: the configured Snowflake node number is leased by
// another live node.
var ErrNodeNumberTaken = errors.New("lease: snowflake node number in use by another node")

var nodeNumberScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return cur`)

// NodeNumbers leases a Snowflake node number for one process.
type NodeNumbers struct {
	rdb  goredis.UniversalClient
	ns   string
	node string
	ttl  time.Duration
	log  *slog.Logger
	n    uint16
}

// TakeNodeNumber takes node number want (want < 0: any, tried from
// snowflake.NodeNumber(node) on) for node. It fails with
// ErrNodeNumberTaken if want is held by another node, or if all are.
func TakeNodeNumber(ctx context.Context, rdb goredis.UniversalClient, ns, node string, want int, log *slog.Logger) (*NodeNumbers, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &NodeNumbers{rdb: rdb, ns: ns, node: node, ttl: NodeNumberTTL, log: log}
	try := func(n uint16) (bool, string, error) {
		v, err := nodeNumberScript.Run(ctx, rdb, []string{l.key(n)}, node, l.ttl.Milliseconds()).Result()
		if err != nil {
			return false, "", fmt.Errorf("lease: lease node number %d: %w", n, err)
		}
		if holder, ok := v.(string); ok {
			return false, holder, nil
		}
		return true, "", nil
	}
	if want >= 0 {
		if want > snowflake.MaxNode {
			return nil, fmt.Errorf("lease: node number %d above %d", want, snowflake.MaxNode)
		}
		ok, holder, err := try(uint16(want))
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: %d is held by %q", ErrNodeNumberTaken, want, holder)
		}
		l.n = uint16(want)
		return l, nil
	}
	start := int(snowflake.NodeNumber(node))
	for i := range snowflake.MaxNode + 1 {
		n := uint16((start + i) % (snowflake.MaxNode + 1))
		ok, _, err := try(n)
		if err != nil {
			return nil, err
		}
		if ok {
			l.n = n
			return l, nil
		}
	}
	return nil, fmt.Errorf("%w: all %d are held", ErrNodeNumberTaken, snowflake.MaxNode+1)
}

// Number is the leased node number.
func (l *NodeNumbers) Number() uint16 { return l.n }

func (l *NodeNumbers) key(n uint16) string {
	return l.ns + ":snowflake:" + strconv.Itoa(int(n))
}

// Run renews the lease until ctx ends, then releases it. A lease found
// held by another node (this process was cut off for longer than the
// TTL) is logged as an error: ids minted meanwhile may collide with that
// node's.
func (l *NodeNumbers) Run(ctx context.Context) {
	tick := time.NewTicker(l.ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			releaseScript.Run(rctx, l.rdb, []string{l.key(l.n)}, l.node)
			cancel()
			return
		case <-tick.C:
		}
		v, err := nodeNumberScript.Run(ctx, l.rdb, []string{l.key(l.n)}, l.node, l.ttl.Milliseconds()).Result()
		switch holder, taken := v.(string); {
		case err != nil:
			if ctx.Err() == nil {
				l.log.Warn("snowflake node number: renewal failed; retrying", "node_number", l.n, "err", err)
			}
		case taken:
			l.log.Error("snowflake node number taken by another node while this one was cut off; message ids may collide",
				"node_number", l.n, "holder", holder)
		}
	}
}
