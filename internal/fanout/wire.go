package fanout

import (
	"strings"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// Wire is stored message m as clients see it (pushes, history, sync).
func Wire(m store.Message) protocol.Message {
	return protocol.Message{
		ConvID: m.ConvID, Seq: m.Seq, MsgID: m.MsgID, Sender: m.Sender, SenderDevice: m.SenderDevice,
		ClientMsgID: m.ClientMsgID, Kind: m.Kind, Body: m.Body, TargetSeq: m.TargetSeq,
		ServerTime: m.ServerTime, Edited: m.Edited, Recalled: m.Recalled,
		Mentions: m.Mentions, MentionAll: m.MentionAll, CoalesceKey: ClientKey(m.CoalesceKey), Superseded: m.Superseded,
		AttachmentID: m.Attachment, ReplyTo: m.ReplyTo, Reactions: WireReactions(m.Reactions),
	}
}

// WireAll is Wire of every message of ms.
func WireAll(ms []store.Message) []protocol.Message {
	out := make([]protocol.Message, len(ms))
	for i, m := range ms {
		out[i] = Wire(m)
	}
	return out
}

// A coalesce key names one sender's state: alice's "red-packet-7" and
// bob's "red-packet-7" are two states, and neither can supersede the
// other's. The store indexes the key scoped by its sender
// ("alice/red-packet-7"; user ids never contain '/'), and clients see the
// key as they sent it.

// ScopedKey is the key the store indexes for a state message of sender.
func ScopedKey(sender, key string) string {
	if key == "" {
		return ""
	}
	return sender + "/" + key
}

// ClientKey is the key as its sender wrote it.
func ClientKey(stored string) string {
	if _, key, ok := strings.Cut(stored, "/"); ok {
		return key
	}
	return stored
}

// WireReactions is counts as the protocol carries them (Me unset).
func WireReactions(counts []store.Reaction) []protocol.Reaction {
	if len(counts) == 0 {
		return nil
	}
	out := make([]protocol.Reaction, len(counts))
	for i, c := range counts {
		out[i] = protocol.Reaction{Emoji: c.Emoji, Count: c.Count}
	}
	return out
}
