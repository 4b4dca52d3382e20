package searchtest

import (
	_ "embed"
	"encoding/json"
	"slices"
	"testing"
	"unicode"

	"github.com/parley-im/parley/internal/search"
)

// labelled is a set of Chinese and English messages with, per query, the
// messages that hold its phrase.
//
//go:embed testdata/labelled.json
var labelled []byte

// testLabelled measures recall and precision on the labelled set: every
// exact Chinese phrase must be found (recall 1); the figures of each
// language are logged (docs/benchmarks.md).
func testLabelled(t *testing.T, e *env) {
	var set struct {
		Messages []struct {
			ID   uint64 `json:"id"`
			Text string `json:"text"`
		} `json:"messages"`
		Queries []struct {
			Text     string   `json:"text"`
			Relevant []uint64 `json:"relevant"`
		} `json:"queries"`
	}
	if err := json.Unmarshal(labelled, &set); err != nil {
		t.Fatal(err)
	}
	var docs []search.Doc
	for _, m := range set.Messages {
		docs = append(docs, doc(1, m.ID, m.Text))
	}
	e.put(t, docs...)
	type tally struct{ tp, fp, fn int }
	var zh, en tally
	for _, q := range set.Queries {
		var got []uint64
		for _, k := range e.find(t, q.Text, all(1)) {
			got = append(got, k.Seq)
		}
		cjk := slices.ContainsFunc([]rune(q.Text), func(r rune) bool { return unicode.Is(unicode.Han, r) })
		tl := &en
		if cjk {
			tl = &zh
		}
		for _, id := range got {
			if slices.Contains(q.Relevant, id) {
				tl.tp++
			} else {
				tl.fp++
				t.Logf("%q: message %d found, not relevant", q.Text, id)
			}
		}
		for _, id := range q.Relevant {
			if !slices.Contains(got, id) {
				tl.fn++
				if cjk {
					t.Errorf("%q: message %d not found: an exact Chinese phrase missed", q.Text, id)
				} else {
					t.Logf("%q: message %d not found", q.Text, id)
				}
			}
		}
	}
	rate := func(a, b int) float64 { return float64(a) / float64(max(a+b, 1)) }
	t.Logf("labelled set: Chinese recall %.3f precision %.3f; English recall %.3f precision %.3f",
		rate(zh.tp, zh.fn), rate(zh.tp, zh.fp), rate(en.tp, en.fn), rate(en.tp, en.fp))
}
