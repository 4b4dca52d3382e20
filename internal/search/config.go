package search

import "github.com/parley-im/parley/internal/settings"

// Config of search. On an embedded node the index is Bleve in
// data_dir/search; a cluster node has no search engine yet and answers
// search requests with unavailable.
type Config struct {
	Enabled       bool `yaml:"enabled" help:"index plain conversations for full-text search (embedded nodes: data_dir/search)"`
	MaxQueryBytes int  `yaml:"max_query_bytes" help:"longest search text in bytes (longer: query_too_long)"`
	MaxQueryTerms int  `yaml:"max_query_terms" help:"most terms in a search text, each CJK character counting as one (more: query_too_complex)"`
	MaxLimit      int  `yaml:"max_limit" help:"largest page of search hits a request may ask for"`
	MaxWindows    int  `yaml:"max_windows" help:"most memberships one search covers (a user in more conversations must name one)"`
	Batch         int  `yaml:"batch" help:"most messages the indexer writes in one index batch"`
}

// DefaultConfig is search on, with DefaultLimits.
func DefaultConfig() Config {
	return Config{Enabled: true, MaxQueryBytes: DefaultLimits.MaxBytes, MaxQueryTerms: DefaultLimits.MaxTerms,
		MaxLimit: DefaultLimits.MaxLimit, MaxWindows: DefaultLimits.MaxWindows, Batch: 2000}
}

// Limits are the query limits of c.
func (c Config) Limits() Limits {
	return Limits{MaxBytes: c.MaxQueryBytes, MaxTerms: c.MaxQueryTerms, MaxLimit: c.MaxLimit, MaxWindows: c.MaxWindows}
}

// Validate checks the limits.
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.MaxQueryBytes >= 1 && c.MaxQueryBytes <= 4096, "max_query_bytes", "must be 1 to 4096, got %d", c.MaxQueryBytes)
	p.Check(c.MaxQueryTerms >= 1 && c.MaxQueryTerms <= 256, "max_query_terms", "must be 1 to 256, got %d", c.MaxQueryTerms)
	p.Check(c.MaxLimit >= 1 && c.MaxLimit <= 1000, "max_limit", "must be 1 to 1000, got %d", c.MaxLimit)
	p.Check(c.MaxWindows >= 1 && c.MaxWindows <= 100000, "max_windows", "must be 1 to 100000, got %d", c.MaxWindows)
	p.Check(c.Batch >= 1, "batch", "must be at least 1, got %d", c.Batch)
	return p.Err("search")
}
