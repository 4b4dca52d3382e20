package fanout

import (
	"context"
	"fmt"

	"github.com/parley-im/parley/internal/ledger"
	"github.com/parley-im/parley/internal/store"
)

// rows writes j's conversation rows by tier and returns how many it wrote:
// small, every member (all are recipients); medium, the members online;
// large, none. @everyone marks them too (and is remembered on the
// conversation for everyone else); explicit mentions reach offline members
// in every tier.
func (f *Fanout) rows(ctx context.Context, j Job, cv store.Conversation, tier uint8, recipients []string) (int, error) {
	if j.RowsWritten {
		// The append wrote every member's row with the message (direct
		// conversations and the smallest groups): counted here, so the
		// per-tier row-write figures stay whole.
		return len(recipients), nil
	}
	m := j.Msg
	n := 0
	if tier != TierLarge {
		var err error
		if n, err = f.writeRows(ctx, cv.ID, m.Seq, recipients, m.MentionAll); err != nil {
			return 0, err
		}
	}
	if !m.MentionAll && len(m.Mentions) > 0 {
		// The store skips users who are not members.
		if _, err := f.writeRows(ctx, cv.ID, m.Seq, m.Mentions, true); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// writeRows is write fan-out; a failure becomes a compensation task, and
// an error is returned only if that cannot be recorded either.
func (f *Fanout) writeRows(ctx context.Context, conv, seq uint64, users []string, mention bool) (int, error) {
	if len(users) == 0 {
		return 0, nil
	}
	if err := f.st.UpdateRows(ctx, conv, seq, users, mention); err != nil {
		f.log.Warn("row fan-out failed; recorded for retry", "conv", conv, "seq", seq, "users", len(users), "err", err)
		if rerr := f.record(ctx, ledger.Task{Kind: ledger.KindRows, Conv: conv, Seq: seq, Users: users, Mention: mention}); rerr != nil {
			return 0, fmt.Errorf("rows: %w; and the ledger: %w", err, rerr)
		}
		return 0, nil
	}
	return len(users), nil
}
