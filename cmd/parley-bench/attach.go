package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/parley-im/parley/internal/bench"
)

func runBenchAttach(ctx context.Context, args []string) error {
	cfg := bench.AttachConfig{BigBytes: 100 << 20, SmallBytes: 1 << 20, Concurrency: 100, PartBytes: 8 << 20, Log: os.Stdout}
	fs := flag.NewFlagSet("parley-bench attach", flag.ContinueOnError)
	engines := fs.String("engines", "disk,s3", "blob engines to measure, comma-separated: disk, s3")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for the disk engine and dd (a fresh one under it; default: the system's temporary directory)")
	fs.StringVar(&cfg.S3, "s3", os.Getenv("PARLEY_TEST_S3"), "the S3 server, http://ACCESS:SECRET@HOST:PORT/BUCKET (default $PARLEY_TEST_S3)")
	fs.Int64Var(&cfg.BigBytes, "big-bytes", cfg.BigBytes, "size of the one big file")
	fs.Int64Var(&cfg.SmallBytes, "small-bytes", cfg.SmallBytes, "size of each small file")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "small files sent and read at once")
	fs.Int64Var(&cfg.PartBytes, "part-bytes", cfg.PartBytes, "part size of uploads in parts")
	fs.IntVar(&cfg.RSSUploads, "rss-uploads", 0, "if > 0: big-file Puts at once through the seam while this process's RSS is sampled")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Engines = strings.Split(*engines, ",")
	dir, err := os.MkdirTemp(cfg.Dir, "parley-bench-attach-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.Dir = dir
	if _, err := bench.RunAttach(ctx, cfg); err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	return nil
}
