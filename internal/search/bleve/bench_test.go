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
)

var (
	zhWords = strings.Fields("我们 明天 北京 开会 项目 进度 报告 客户 需求 测试 上线 服务器 数据库 周末 午饭 会议室 预算 设计 文档 问题")
	enWords = strings.Fields("meeting tomorrow project status report customer release server database weekend lunch budget design document issue deploy review")
)

func text(r *rand.Rand) string {
	var b strings.Builder
	n := 4 + r.IntN(12)
	for i := range n {
		if r.IntN(2) == 0 {
			b.WriteString(zhWords[r.IntN(len(zhWords))])
		} else {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(enWords[r.IntN(len(enWords))])
		}
	}
	return b.String()
}

// TestBenchSearch measures the embedded engine (docs/benchmarks.md,
// "Search"): indexing throughput in batches of 2,000, index bytes per
// message, and query latency for a user in 1,000 conversations with the
// membership filter. It runs only with PARLEY_SEARCH_BENCH=N (messages).
func TestBenchSearch(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("PARLEY_SEARCH_BENCH"))
	if total == 0 {
		t.Skip("set PARLEY_SEARCH_BENCH=<messages> to run")
	}
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
			c := uint64(1 + r.IntN(convs))
			seqs[c]++
			d := search.Doc{ConvID: c, Seq: seqs[c], MsgID: uint64(done + 1), Sender: fmt.Sprintf("u%d", r.IntN(2000)), Time: int64(1_790_000_000_000 + done), Kind: "text", Text: text(r)}
			textBytes += int64(len(d.Text))
			b.Put = append(b.Put, d)
			b.Marks[c] = seqs[c]
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
	for c := uint64(1); c <= 1000; c++ {
		w := search.Window{ConvID: c * 5, From: 1}
		if c%10 == 0 {
			w.From = max(seqs[c*5]/2, 1)
		}
		ws = append(ws, w)
	}
	for _, q := range []string{"北京开会", "项目进度", "release review", "数据库", "budget"} {
		var lat []time.Duration
		hits := 0
		for i := range 50 {
			o := search.Newest
			if i%2 == 1 {
				o = search.Relevance
			}
			t0 := time.Now()
			res, err := x.Search(ctx, search.Query{Text: q, Windows: ws, Limit: 20, Order: o})
			lat = append(lat, time.Since(t0))
			if err != nil {
				t.Fatal(err)
			}
			hits = len(res.Hits)
		}
		slices.Sort(lat)
		t.Logf("query %q over 1,000 conversations: p50 %v p99 %v (page of %d)", q, lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond), hits)
	}
}
