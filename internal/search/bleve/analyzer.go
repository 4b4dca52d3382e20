package bleve

import (
	"unicode"
	"unicode/utf8"

	"github.com/blevesearch/bleve/v2/analysis"
	"github.com/blevesearch/bleve/v2/analysis/lang/cjk"
	"github.com/blevesearch/bleve/v2/analysis/lang/en"
	"github.com/blevesearch/bleve/v2/analysis/token/lowercase"
	unicodetok "github.com/blevesearch/bleve/v2/analysis/tokenizer/unicode"
	"github.com/blevesearch/bleve/v2/registry"
)

// textAnalyzer is the analyzer of the one text field and of the query's
// phrase: Unicode word segmentation, width folding, every CJK character
// (Han, Hiragana, Katakana, Hangul) a term of its own — the way
// search.Terms counts them, so any run of CJK characters is a phrase of
// them and every exact CJK substring is found without a second, bigram
// field — lower-cased, English stop words dropped.
const textAnalyzer = "parley_text"

func isCJK(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul)
}

// cjkChars splits every token holding CJK characters into one token per
// CJK character (and one per run of other characters between them), and
// numbers the positions of the whole stream again so the characters of a
// word stay adjacent.
type cjkChars struct{}

func (cjkChars) Filter(in analysis.TokenStream) analysis.TokenStream {
	out := make(analysis.TokenStream, 0, len(in))
	pos := 0
	emit := func(t *analysis.Token, term []byte, start int) {
		pos++
		out = append(out, &analysis.Token{Term: term, Start: t.Start + start, End: t.Start + start + len(term),
			Position: pos, Type: t.Type, KeyWord: t.KeyWord})
	}
	for _, t := range in {
		if !hasCJK(t.Term) {
			pos++
			t.Position = pos
			out = append(out, t)
			continue
		}
		run := -1 // start of the current run of other characters
		for i := 0; i < len(t.Term); {
			r, n := utf8.DecodeRune(t.Term[i:])
			if !isCJK(r) {
				if run < 0 {
					run = i
				}
				i += n
				continue
			}
			if run >= 0 {
				emit(t, t.Term[run:i], run)
				run = -1
			}
			emit(t, t.Term[i:i+n], i)
			i += n
		}
		if run >= 0 {
			emit(t, t.Term[run:], run)
		}
	}
	return out
}

func hasCJK(b []byte) bool {
	for _, r := range string(b) {
		if isCJK(r) {
			return true
		}
	}
	return false
}

func textAnalyzerConstructor(_ map[string]any, cache *registry.Cache) (analysis.Analyzer, error) {
	tok, err := cache.TokenizerNamed(unicodetok.Name)
	if err != nil {
		return nil, err
	}
	var fs []analysis.TokenFilter
	for _, name := range []string{cjk.WidthName, "", lowercase.Name, en.StopName} {
		if name == "" {
			fs = append(fs, cjkChars{})
			continue
		}
		f, err := cache.TokenFilterNamed(name)
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
	return &analysis.DefaultAnalyzer{Tokenizer: tok, TokenFilters: fs}, nil
}

func init() {
	if err := registry.RegisterAnalyzer(textAnalyzer, textAnalyzerConstructor); err != nil {
		panic(err)
	}
}
