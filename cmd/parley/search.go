package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/parley-im/parley/internal/admin"
	"github.com/parley-im/parley/internal/config"
)

const searchUsage = "parley search reindex [-conv ID] [--config FILE] [--<setting> VALUE ...]"

// runSearch administers a running node's search index: `reindex`
// rebuilds it (one conversation, or every plain one) through the server
// API while the node serves, drawing a bar on stderr.
func runSearch(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "reindex" {
		fmt.Fprintln(stderr, "usage: "+searchUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return nil
		}
		return errors.New("search: the only subcommand is reindex")
	}
	flags := config.NewFlagSet("parley search reindex")
	conv := flags.Uint64("conv", 0, "rebuild only this conversation (default: every plain conversation)")
	cfg, err := loadConfigOf(flags, searchUsage, args[1:], backupSettings)
	if err != nil {
		return err
	}
	body := []byte("{}")
	if *conv != 0 {
		body, _ = json.Marshal(map[string]string{"conv_id": strconv.FormatUint(*conv, 10)})
	}
	resp, err := adminPost(ctx, cfg, admin.ReindexRoute, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("search reindex: %w", err)
	}
	defer resp.Body.Close()
	bar := &progress{w: stderr}
	show := func(c *admin.ReindexCount, what string) {
		bar.total, bar.done = uint64(c.TotalMessages), uint64(c.Messages)
		bar.all, bar.convs = c.TotalConversations, c.Conversations
		bar.what = what
		bar.draw(what == "done")
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l admin.ReindexLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("search reindex: undecodable line from the node: %w", err)
		}
		switch {
		case l.Error != nil:
			fmt.Fprintln(stderr)
			return fmt.Errorf("search reindex: the node stopped it: %s: %s", l.Error.Code, l.Error.Error)
		case l.Done != nil:
			show(l.Done, "done")
			fmt.Fprintln(stderr)
			return nil
		case l.Progress != nil:
			show(l.Progress, "")
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("search reindex: %w", err)
	}
	return errors.New("search reindex: the node's stream ended before the reindex did (the node stopped?); run it again")
}
