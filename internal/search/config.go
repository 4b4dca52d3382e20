package search

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/parley-im/parley/internal/settings"
)

// Config of search. On an embedded node the index is Bleve in
// data_dir/search; a cluster node's is OpenSearch at OpenSearchURL,
// shared by the deployment's chat processes (none: it answers search
// requests with unavailable).
type Config struct {
	Enabled       bool `yaml:"enabled" help:"index plain conversations for full-text search (embedded nodes: data_dir/search)"`
	MaxQueryBytes int  `yaml:"max_query_bytes" help:"longest search text in bytes (longer: query_too_long)"`
	MaxQueryTerms int  `yaml:"max_query_terms" help:"most terms in a search text, each CJK character counting as one (more: query_too_complex)"`
	MaxLimit      int  `yaml:"max_limit" help:"largest page of search hits a request may ask for"`
	MaxWindows    int  `yaml:"max_windows" help:"most memberships one search covers (a user in more conversations must name one)"`
	Batch         int  `yaml:"batch" help:"most messages the indexer writes in one index batch"`
	// OpenSearchURL names the OpenSearch nodes of a cluster deployment.
	OpenSearchURL      string `yaml:"opensearch_url" help:"cluster mode: OpenSearch node URLs, comma-separated http(s)://[user:password@]host:port; indexes <cluster.namespace>-search-messages and -marks (empty: a cluster node answers search with search_unavailable)"`
	OpenSearchShards   int    `yaml:"opensearch_shards" help:"primary shards of the messages index when a chat process creates it"`
	OpenSearchReplicas int    `yaml:"opensearch_replicas" help:"replicas of the search indexes when a chat process creates them (1 or more on a multi-node OpenSearch cluster)"`
}

// DefaultConfig is search on, with DefaultLimits.
func DefaultConfig() Config {
	return Config{Enabled: true, MaxQueryBytes: DefaultLimits.MaxBytes, MaxQueryTerms: DefaultLimits.MaxTerms,
		MaxLimit: DefaultLimits.MaxLimit, MaxWindows: DefaultLimits.MaxWindows, Batch: 2000, OpenSearchShards: 1}
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
	if c.OpenSearchURL != "" {
		_, err := SplitURLs(c.OpenSearchURL)
		p.Check(err == nil, "opensearch_url", "%v", err)
	}
	p.Check(c.OpenSearchShards >= 1 && c.OpenSearchShards <= 1024, "opensearch_shards", "must be 1 to 1024, got %d", c.OpenSearchShards)
	p.Check(c.OpenSearchReplicas >= 0 && c.OpenSearchReplicas <= 16, "opensearch_replicas", "must be 0 to 16, got %d", c.OpenSearchReplicas)
	return p.Err("search")
}

// SplitURLs splits a comma-separated list of http(s) URLs.
func SplitURLs(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		u, err := url.Parse(p)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%q is not an http(s)://host:port URL", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("no URL")
	}
	return out, nil
}
