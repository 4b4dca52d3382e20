// Package snowflake generates time-ordered 63-bit message ids: 41 bits of
// milliseconds since 2024-01-01 UTC, 10 bits of node number, 12 bits of
// per-millisecond sequence. A Generator is safe for concurrent use.
package snowflake

import (
	"sync"
	"time"
)

// Epoch is the zero of the id clock.
var Epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

const (
	nodeBits = 10
	seqBits  = 12
	maxNode  = MaxNode
	maxSeq   = 1<<seqBits - 1
)

// MaxNode is the largest node number.
const MaxNode = 1<<nodeBits - 1

// Generator hands out ids for one node. Ids are strictly increasing even if
// the wall clock steps back: the generator keeps its own last millisecond and
// borrows from the future until the clock catches up.
type Generator struct {
	node int64
	now  func() time.Time

	mu struct {
		sync.Mutex
		ms  int64
		seq int64
	}
}

// New returns a generator for node (0..1023; larger values are reduced).
func New(node uint16, now func() time.Time) *Generator {
	if now == nil {
		now = time.Now
	}
	return &Generator{node: int64(node) & maxNode, now: now}
}

// Next returns the next id.
func (g *Generator) Next() uint64 {
	ms := g.now().UnixMilli() - Epoch
	g.mu.Lock()
	defer g.mu.Unlock()
	if ms <= g.mu.ms {
		ms = g.mu.ms
		g.mu.seq++
		if g.mu.seq > maxSeq {
			ms++
			g.mu.seq = 0
		}
	} else {
		g.mu.seq = 0
	}
	g.mu.ms = ms
	return uint64(ms<<(nodeBits+seqBits) | g.node<<seqBits | g.mu.seq)
}

// Time returns the wall-clock millisecond (unix ms) embedded in id.
func Time(id uint64) int64 {
	return int64(id>>(nodeBits+seqBits)) + Epoch
}

// NodeNumber maps a node name to a 10-bit node number (FNV-1a). Distinct
// names can collide; cluster deployments should set node numbers explicitly.
func NodeNumber(name string) uint16 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return uint16(h & maxNode)
}
