package bleve_test

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/search"
	"github.com/parley-im/parley/internal/search/bleve"
	"github.com/parley-im/parley/internal/search/searchtest"
)

// corpus makes the messages of a benchmark and names the phrases it
// queries.
type corpus struct {
	text    func(r *rand.Rand) string
	queries []string
}

// worst: the embedded and cluster benchmarks' shared corpus (4–15 words
// drawn uniformly from 37), so every phrase matches a large share of all
// messages.
var worst = corpus{text: searchtest.BenchText, queries: searchtest.BenchQueries}

// zipf: a vocabulary of 3,000 Chinese words (two or three of 400 common
// characters) and 3,000 English ones (two to four syllables), each drawn
// by a Zipf law (s = 1.1) over its ranks; a message is Chinese or English
// (3 to 2) and has 4–30 words. The queries run from the most frequent
// word to rare phrases.
var zipf = func() corpus {
	r := rand.New(rand.NewPCG(7, 8))
	chars := []rune("的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从知样问日电话手机开门关心工作朋友时间明白意思东西地方先生今晚下午上午晚上周末午饭咖啡会议报告项目进度客户需求测试上线服务器数据库预算设计文档问题北京上海广州深圳城市火车飞机酒店房间价格订单快递支付红包群聊消息图片视频语音照片生日快乐新年谢谢麻烦帮忙知道觉得喜欢希望可能应该已经马上一起准备安排")
	syl := strings.Fields("ba be bi bo bu da de di do du fa fe fi fo ka ke ki ko la le li lo lu ma me mi mo mu na ne ni no pa pe pi po ra re ri ro sa se si so ta te ti to va ve vi wa we ya yo za zo ex in on an er or al")
	uniq := func(gen func() string) []string {
		seen := map[string]bool{}
		var out []string
		for len(out) < 3000 {
			if w := gen(); !seen[w] {
				seen[w] = true
				out = append(out, w)
			}
		}
		return out
	}
	zh := uniq(func() string {
		n := 2 + r.IntN(2)
		var b strings.Builder
		for range n {
			b.WriteRune(chars[r.IntN(len(chars))])
		}
		return b.String()
	})
	en := uniq(func() string {
		n := 2 + r.IntN(3)
		var b strings.Builder
		for range n {
			b.WriteString(syl[r.IntN(len(syl))])
		}
		return b.String()
	})
	return corpus{
		text: func(r *rand.Rand) string {
			z := rand.NewZipf(r, 1.1, 1, uint64(len(zh)-1))
			n := 4 + r.IntN(27)
			var b strings.Builder
			if r.IntN(5) < 3 {
				for range n {
					b.WriteString(zh[z.Uint64()])
				}
				return b.String()
			}
			for i := range n {
				if i > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(en[z.Uint64()])
			}
			return b.String()
		},
		// Ranks 1, 30 and 800 alone; two-word phrases of ranks 1+2 and
		// 5+40.
		queries: []string{zh[0], en[29], zh[799], en[0] + " " + en[1], zh[4] + zh[39]},
	}
}()

// TestBenchSearch measures the embedded engine (docs/benchmarks.md,
// "Search"): indexing throughput in batches of 2,000, index bytes per
// message, and query latency for a user in 1,000 conversations with the
// membership filter, on the worst corpus and on the Zipf one. It runs
// only with PARLEY_SEARCH_BENCH=N (messages per corpus).
func TestBenchSearch(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("PARLEY_SEARCH_BENCH"))
	if total == 0 {
		t.Skip("set PARLEY_SEARCH_BENCH=<messages> to run")
	}
	t.Run("worst", func(t *testing.T) { benchSearch(t, total, worst) })
	t.Run("zipf", func(t *testing.T) { benchSearch(t, total, zipf) })
}

func benchSearch(t *testing.T, total int, c corpus) {
	const convs, batch = 5000, 2000
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "search")
	x, err := bleve.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	r := rand.New(rand.NewPCG(1, 2))
	seqs := make([]uint64, convs+1)
	var textBytes int64
	start := time.Now()
	for done := 0; done < total; {
		b := search.Batch{Marks: map[uint64]uint64{}}
		for i := 0; i < batch && done < total; i, done = i+1, done+1 {
			cv := uint64(1 + r.IntN(convs))
			seqs[cv]++
			d := search.Doc{ConvID: cv, Seq: seqs[cv], MsgID: uint64(done + 1), Sender: fmt.Sprintf("u%d", r.IntN(2000)), Time: int64(1_790_000_000_000 + done), Kind: "text", Text: c.text(r)}
			textBytes += int64(len(d.Text))
			b.Put = append(b.Put, d)
			b.Marks[cv] = seqs[cv]
		}
		if err := x.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	el := time.Since(start)
	var size int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	t.Logf("indexed %d messages in %v: %.0f msgs/s; index %d bytes, %.1f bytes/message (text %.1f bytes/message)",
		total, el.Round(time.Millisecond), float64(total)/el.Seconds(), size, float64(size)/float64(total), float64(textBytes)/float64(total))
	// A user in 1,000 conversations: 900 whole, 100 from a join seq on.
	var ws []search.Window
	for cv := uint64(1); cv <= 1000; cv++ {
		w := search.Window{ConvID: cv * 5, From: 1}
		if cv%10 == 0 {
			w.From = max(seqs[cv*5]/2, 1)
		}
		ws = append(ws, w)
	}
	for _, q := range c.queries {
		lat := [2][]time.Duration{}
		hits := 0
		for i := range 100 {
			o := search.Order(i % 2)
			t0 := time.Now()
			res, err := x.Search(ctx, search.Query{Text: q, Windows: ws, Limit: 20, Order: o})
			lat[o] = append(lat[o], time.Since(t0))
			if err != nil {
				t.Fatal(err)
			}
			hits = len(res.Hits)
		}
		pc := func(l []time.Duration) string {
			slices.Sort(l)
			return fmt.Sprintf("p50 %v p99 %v", l[len(l)/2].Round(time.Microsecond), l[len(l)*99/100].Round(time.Microsecond))
		}
		t.Logf("query %q over 1,000 conversations: newest %s, relevance %s (page of %d)", q, pc(lat[search.Newest]), pc(lat[search.Relevance]), hits)
	}
}
