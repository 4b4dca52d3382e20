//go:build !linux

package bench

import (
	"context"
	"errors"
)

// runFanoutConns needs epoll: the fan-out client runs on Linux only.
func runFanoutConns(context.Context, FanoutClientConfig, []byte, func(int), func(func() FanoutReport)) error {
	return errors.New("the fan-out benchmark client needs Linux (epoll)")
}
