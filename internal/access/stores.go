package access

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// FileStore keeps the list of an embedded node in one JSON file, replaced
// atomically (written to a temporary file, synced, renamed, directory
// synced) with mode 0600. Only its own process writes it, so its version
// is an in-memory counter.
type FileStore struct {
	path string
	mu   sync.Mutex
	m    map[string]Entry
	ver  uint64
}

type fileDoc struct {
	Entries []Entry `json:"entries"`
}

// OpenFile opens (or starts) the list at path.
func OpenFile(path string) (*FileStore, error) {
	s := &FileStore{path: path, m: map[string]Entry{}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("access: %w", err)
	}
	var doc fileDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("access: %s: %w", path, err)
	}
	for _, e := range doc.Entries {
		s.m[e.Key()] = e
	}
	s.ver = 1
	return s, nil
}

// Put implements Store.
func (s *FileStore) Put(_ context.Context, e Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.m[e.Key()]
	s.m[e.Key()] = e
	if err := s.write(); err != nil {
		if had {
			s.m[e.Key()] = old
		} else {
			delete(s.m, e.Key())
		}
		return err
	}
	s.ver++
	return nil
}

func (s *FileStore) write() error {
	doc := fileDoc{Entries: make([]Entry, 0, len(s.m))}
	for _, e := range s.m {
		doc.Entries = append(doc.Entries, e)
	}
	sort.Slice(doc.Entries, func(i, j int) bool { return doc.Entries[i].Key() < doc.Entries[j].Key() })
	data, err := json.MarshalIndent(doc, "", " ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("access: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".access-*")
	if err != nil {
		return fmt.Errorf("access: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("access: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("access: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("access: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("access: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("access: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("access: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("access: %w", err)
	}
	return nil
}

// Load implements Store.
func (s *FileStore) Load(context.Context) ([]Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.m))
	for _, e := range s.m {
		out = append(out, e)
	}
	return out, nil
}

// Version implements Store.
func (s *FileStore) Version(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.FormatUint(s.ver, 10), nil
}

// RedisStore keeps a cluster's list in Redis: a hash <prefix>access
// (field: the entry's key, value: the entry as JSON) and a counter
// <prefix>access:ver raised in the same MULTI by every Put, which the
// processes poll. The list is as durable as the Redis deployment: run it
// with persistence (appendonly) so a ban survives a Redis restart.
type RedisStore struct {
	rdb       goredis.UniversalClient
	hash, ver string
}

// NewRedis returns the store under prefix (the cluster namespace and a
// colon).
func NewRedis(rdb goredis.UniversalClient, prefix string) *RedisStore {
	return &RedisStore{rdb: rdb, hash: prefix + "access", ver: prefix + "access:ver"}
}

// Put implements Store.
func (s *RedisStore) Put(ctx context.Context, e Entry) error {
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = s.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.HSet(ctx, s.hash, e.Key(), data)
		p.Incr(ctx, s.ver)
		return nil
	})
	if err != nil {
		return fmt.Errorf("access: redis: %w", err)
	}
	return nil
}

// Load implements Store.
func (s *RedisStore) Load(ctx context.Context) ([]Entry, error) {
	all, err := s.rdb.HGetAll(ctx, s.hash).Result()
	if err != nil {
		return nil, fmt.Errorf("access: redis: %w", err)
	}
	out := make([]Entry, 0, len(all))
	for k, v := range all {
		var e Entry
		if err := json.Unmarshal([]byte(v), &e); err != nil || e.Key() != k {
			return nil, fmt.Errorf("access: redis: bad entry %q", k)
		}
		out = append(out, e)
	}
	return out, nil
}

// Version implements Store.
func (s *RedisStore) Version(ctx context.Context) (string, error) {
	v, err := s.rdb.Get(ctx, s.ver).Result()
	if errors.Is(err, goredis.Nil) {
		return "0", nil
	}
	if err != nil {
		return "", fmt.Errorf("access: redis: %w", err)
	}
	return v, nil
}
