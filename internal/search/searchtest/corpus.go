package searchtest

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/parley-im/parley/internal/search"
)

// The benchmark corpus: mixed Chinese and English messages of 4 to 15
// words from two small vocabularies, spread uniformly over conversations,
// and a user's membership windows over them. Every engine's benchmark
// draws the same corpus from the same seed, so their figures compare.
var (
	benchZh = strings.Fields("我们 明天 北京 开会 项目 进度 报告 客户 需求 测试 上线 服务器 数据库 周末 午饭 会议室 预算 设计 文档 问题")
	benchEn = strings.Fields("meeting tomorrow project status report customer release server database weekend lunch budget design document issue deploy review")
)

// BenchQueries are the benchmark's queries: Chinese phrases, an English
// phrase, a Chinese word, an English word.
var BenchQueries = []string{"北京开会", "项目进度", "release review", "数据库", "budget"}

// BenchText is one message's text.
func BenchText(r *rand.Rand) string {
	var b strings.Builder
	n := 4 + r.IntN(12)
	for i := range n {
		if r.IntN(2) == 0 {
			b.WriteString(benchZh[r.IntN(len(benchZh))])
		} else {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(benchEn[r.IntN(len(benchEn))])
		}
	}
	return b.String()
}

// BenchCorpus generates total messages over convs conversations in
// batches of batch documents with their watermarks, calling apply with
// each; seqs[c] ends as conversation c's last seq (c from 1).
type BenchCorpus struct {
	Convs, Batch int
	r            *rand.Rand
	Seqs         []uint64
	TextBytes    int64
	done         int
}

// NewBenchCorpus starts the corpus of seed (1, 2).
func NewBenchCorpus(convs, batch int) *BenchCorpus {
	return &BenchCorpus{Convs: convs, Batch: batch, r: rand.New(rand.NewPCG(1, 2)), Seqs: make([]uint64, convs+1)}
}

// Next is the next batch of at most Batch of the total messages (empty
// when total are made).
func (c *BenchCorpus) Next(total int) search.Batch {
	b := search.Batch{Marks: map[uint64]uint64{}}
	for i := 0; i < c.Batch && c.done < total; i, c.done = i+1, c.done+1 {
		conv := uint64(1 + c.r.IntN(c.Convs))
		c.Seqs[conv]++
		d := search.Doc{ConvID: conv, Seq: c.Seqs[conv], MsgID: uint64(c.done + 1), Sender: fmt.Sprintf("u%d", c.r.IntN(2000)),
			Time: int64(1_790_000_000_000 + c.done), Kind: "text", Text: BenchText(c.r)}
		c.TextBytes += int64(len(d.Text))
		b.Put = append(b.Put, d)
		b.Marks[conv] = c.Seqs[conv]
	}
	return b
}

// Windows are a user's membership in 1,000 of the conversations (every
// fifth): 900 whole, 100 from the middle of the conversation on (a late
// joiner's).
func (c *BenchCorpus) Windows() []search.Window {
	var ws []search.Window
	for i := uint64(1); i <= 1000 && int(i*5) <= c.Convs; i++ {
		w := search.Window{ConvID: i * 5, From: 1}
		if i%10 == 0 {
			w.From = max(c.Seqs[i*5]/2, 1)
		}
		ws = append(ws, w)
	}
	return ws
}
