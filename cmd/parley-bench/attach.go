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
	fs.IntVar(&cfg.Rounds, "rounds", 1, "times each engine's rows are measured (raw and seam alternating); the medians are printed at the end")
	fs.StringVar(&cfg.ServerBinary, "server-binary", "", "a parley executable: also measure the transfers through a node of it (-rss-uploads then samples the node's RSS)")
	fs.StringVar(&cfg.BaseBinary, "base-binary", "", "with -server-binary: another parley executable (the build compared against), measured in the same rounds as layer \"parley base\"")
	fs.BoolVar(&cfg.Thumbnail, "thumbnail", false, "with -server-binary: time a 4000x3000 JPEG's first thumbnail")
	serverLog := fs.Bool("server-log", false, "with -server-binary: the node's log on stderr")
	fs.IntVar(&cfg.RSSUploads, "rss-uploads", 0, "if > 0: big-file Puts at once through the seam while this process's RSS is sampled")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Engines = strings.Split(*engines, ",")
	if *serverLog {
		cfg.ServerLog = os.Stderr
	}
	dir, err := os.MkdirTemp(cfg.Dir, "parley-bench-attach-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.Dir = dir
	rep, err := bench.RunAttach(ctx, cfg)
	if err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	fmt.Printf("\nmedians of %d rounds:\n\n| engine | layer | op | s | MiB/s |\n|---|---|---|---:|---:|\n", cfg.Rounds)
	for _, r := range rep.Medians() {
		fmt.Printf("| %s | %s | %s | %.3f | %.0f |\n", r.Engine, r.Layer, r.Op, r.Elapsed.Seconds(), r.MiBps())
	}
	for _, e := range cfg.Engines {
		for _, k := range []string{e, e + " base"} {
			if idle, ok := rep.ServerRSSIdle[k]; ok {
				fmt.Printf("\n%s: the node's RSS during %d concurrent %d-byte uploads: %.1f MiB idle, %.1f MiB peak (+%.1f); %d of the uploads failed\n",
					k, cfg.RSSUploads, cfg.BigBytes, float64(idle)/(1<<20), float64(rep.ServerRSSPeak[k])/(1<<20), float64(rep.ServerRSSPeak[k]-idle)/(1<<20), rep.ServerRSSFailed[k])
			}
			if d, ok := rep.Thumbnail[k]; ok {
				fmt.Printf("\n%s: first thumbnail %.0f ms after upload_complete\n", k, float64(d.Microseconds())/1000)
			}
		}
		if idle, ok := rep.RSSIdle[e]; ok {
			fmt.Printf("\n%s: RSS of this process during %d concurrent %d-byte Puts: %.1f MiB idle, %.1f MiB peak\n",
				e, cfg.RSSUploads, cfg.BigBytes, float64(idle)/(1<<20), float64(rep.RSSPeak[e])/(1<<20))
		}
	}
	return nil
}
