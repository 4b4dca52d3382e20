package client

import "github.com/parley-im/parley/protocol"

// Reactions on the client. A message's Reactions are its counts (Me, on
// reads, marks the user's own). A reaction event (kind react or unreact)
// reaches the Events stream as an EventMessage like an edit: pushed on
// its own (direct conversations, small groups) it carries its emoji in
// Body, its sender, and its target's counts after it in Reactions; read
// back (history, sync) or coalesced (a medium or large group's reactions
// push) it is a stub without emoji, the last one of each target carrying
// the target's counts (with Me on reads) and the others Superseded.
// ReactionUpdate tells which: apply its counts to the target's.

// ReactionUpdate returns the target and counts a reaction event m sets
// (ok false: m is no reaction event, or a superseded one that sets
// nothing).
func ReactionUpdate(m protocol.Message) (target uint64, counts []protocol.Reaction, ok bool) {
	if (m.Kind != protocol.KindReact && m.Kind != protocol.KindUnreact) || m.Superseded {
		return 0, nil, false
	}
	return m.TargetSeq, m.Reactions, true
}

// ReactionStubs are the seqs a reactions push covers (FromSeq..Seq) as
// the stubs a history page would hold: one reaction event each, without
// sender or emoji, the last len(Reacted) of them carrying each target's
// counts (a run of n events changes at most n targets) and the others
// Superseded. The dispatcher offers them as messages, so the push fills
// the conversation's position like any other.
func ReactionStubs(f *protocol.Frame) []protocol.Message {
	if f.FromSeq == 0 || f.Seq < f.FromSeq {
		return nil
	}
	n := f.Seq - f.FromSeq + 1
	out := make([]protocol.Message, 0, n)
	carried := uint64(min(uint64(len(f.Reacted)), n))
	for s := f.FromSeq; s <= f.Seq; s++ {
		m := protocol.Message{ConvID: f.ConvID, Seq: s, Kind: protocol.KindReact, Superseded: true}
		if k := f.Seq - s; k < carried {
			r := f.Reacted[carried-1-k]
			m.Superseded, m.TargetSeq, m.Reactions = false, r.Seq, r.Reactions
		}
		out = append(out, m)
	}
	return out
}
