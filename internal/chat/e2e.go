package chat

import (
	"context"

	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
)

// End-to-end encrypted conversations. A conversation is created E2E
// or not and never changes. Its bodies are E2E envelopes the server cannot
// read (protocol.ParseEnvelope checks the form: a plaintext body is
// refused with e2e_required). Everything that only moves or counts
// messages works as for any conversation: seq, history, sync, snapshots,
// receipts, edits (a new envelope), recall (with or without an envelope),
// every fan-out tier. What would
// need the server to read or learn content is refused with
// e2e_unsupported: mentions and @everyone (the server would learn who a
// message names; clients highlight mentions locally after decrypting).

// checkE2E vets a send, edit or recall for the conversation's mode. A
// recall may carry a body only in an E2E conversation: its author's
// sealed recall, which clients require before they hide the target (the
// server's own recall, moderation, has none and stays possible).
func checkE2E(cv store.Conversation, f *protocol.Frame) *protocol.Error {
	if !cv.E2E {
		if f.Type == protocol.TypeRecall && f.Body != "" {
			return protocol.Errorf(protocol.CodeInvalidArgument, "recall takes no body outside end-to-end encrypted conversations")
		}
		return nil
	}
	if f.Type == protocol.TypeReact {
		return protocol.Errorf(protocol.CodeE2EUnsupported, "in an end-to-end encrypted conversation a reaction is a message inside the encryption (the server would learn it otherwise)")
	}
	if len(f.Mentions) > 0 || f.MentionAll {
		return protocol.Errorf(protocol.CodeE2EUnsupported, "mentions are not available in end-to-end encrypted conversations (the server would learn who a message names)")
	}
	if f.Type == protocol.TypeRecall && f.Body == "" {
		return nil
	}
	if _, err := protocol.ParseEnvelope(f.Body); err != nil {
		return protocol.Errorf(protocol.CodeE2ERequired, "this conversation is end-to-end encrypted: %v", err)
	}
	return nil
}

// convInfoFrame answers conv_info: the conv frame of a conversation the caller
// is a current member of.
func (s *Service) convInfoFrame(ctx context.Context, c Caller, convID uint64) (*protocol.Frame, *protocol.Error) {
	m, perr := s.member(ctx, c.User, convID)
	if perr != nil {
		return nil, perr
	}
	if m.LeaveSeq != 0 {
		return nil, protocol.Errorf(protocol.CodeNotMember, "no longer a member of this conversation")
	}
	return s.convAfterChange(ctx, convID, c.User)
}
