// Package storetest is the conformance suite of store.Store. Every engine
// runs it unchanged (Run), so it uses nothing but the interface.
//
// Run's subtests run one after another, each on a fresh store from
// Harness.Open; within a subtest many goroutines use the store at once, so
// the suite also checks the engine's concurrency contract (run it with -race).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/parley-im/parley/internal/store"
)

// Harness opens stores for the suite.
type Harness struct {
	// Open returns a new, empty store.
	Open func(t *testing.T) store.Store
	// Reopen closes s and opens the same data again.
	Reopen func(t *testing.T, s store.Store) store.Store
	// Evict, if set, drops every per-conversation state s may drop now,
	// as its memory bound would (the Evict* subtests skip without it).
	Evict func(s store.Store)
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"CreateConversation", testCreateConversation},
		{"NotFound", testNotFound},
		{"SeqDenseOneConversation", testSeqDenseOneConversation},
		{"SeqDenseManyConversations", testSeqDenseManyConversations},
		{"IdempotentSequential", testIdempotentSequential},
		{"IdempotentConcurrent", testIdempotentConcurrent},
		{"AppendTurns", testAppendTurns},
		{"Reopen", testReopen},
		{"MessagesBounds", testMessagesBounds},
		{"LatestBounds", testLatestBounds},
		{"EmptyConversation", testEmptyConversation},
		{"ManyBuckets", testManyBuckets},
		{"Edit", testEdit},
		{"Recall", testRecall},
		{"EditRefused", testEditRefused},
		{"EditAsOf", testEditAsOf},
		{"RecallAsOf", testRecallAsOf},
		{"Reply", testReply},
		{"React", testReact},
		{"DirectConcurrent", testDirectConcurrent},
		{"AddMembers", testAddMembers},
		{"RemoveMembers", testRemoveMembers},
		{"RemoveBeforeFirstMessage", testRemoveBeforeFirstMessage},
		{"Rejoin", testRejoin},
		{"SetRoleMuted", testSetRoleMuted},
		{"SetTier", testSetTier},
		{"MembershipConcurrent", testMembershipConcurrent},
		{"MembersBulk", testMembersBulk},
		{"UpdateRows", testUpdateRows},
		{"UpdateRowsConcurrent", testUpdateRowsConcurrent},
		{"Mentions", testMentions},
		{"Coalesce", testCoalesce},
		{"ReadPositions", testReadPositions},
		{"DeliveredPositions", testDeliveredPositions},
		{"KeyDirectory", testKeyDirectory},
		{"KeyDirectoryConcurrent", testKeyDirectoryConcurrent},
		{"E2EConversations", testE2EConversations},
		{"KTLog", testKTLog},
		{"KTAppendRace", testKTAppendRace},
		{"KTKeys", testKTKeys},
		{"KTBadArguments", testKTBadArguments},
		{"Attachments", testAttachments},
		{"AttachmentQuota", testAttachmentQuota},
		{"AttachmentQuotaRace", testAttachmentQuotaRace},
		{"AttachmentLists", testAttachmentLists},
		{"AttachmentMessage", testAttachmentMessage},
		{"AttachmentBadArguments", testAttachmentBadArguments},
		{"PushRegistrations", testPushRegistrations},
		{"PushConcurrent", testPushConcurrent},
		{"NotifyPrefs", testNotifyPrefs},
		{"Outbox", testOutbox},
		{"OutboxConcurrent", testOutboxConcurrent},
		{"AppendRows", testAppendRows},
		{"AppendReadBy", testAppendReadBy},
		{"Export", testExport},
		{"BadArguments", testBadArguments},
		{"Closed", testClosed},
		{"EvictBetweenOperations", testEvictBetweenOperations},
		{"EvictConcurrent", testEvictConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{h: h}
			e.s = e.open(t)
			tc.fn(t, e)
		})
	}
}

// env is one subtest's store and id source.
type env struct {
	h     Harness
	s     store.Store
	msgID atomic.Uint64
}

func (e *env) open(t *testing.T) store.Store {
	t.Helper()
	s := e.h.Open(t)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (e *env) reopen(t *testing.T) {
	t.Helper()
	s := e.h.Reopen(t, e.s)
	t.Cleanup(func() { _ = s.Close() })
	e.s = s
}

// baseTime is the server time of the suite's first message (2024-01-01).
const baseTime = int64(1_704_067_200_000)

// msg returns a message to append to conv. Msg ids grow like snowflakes.
func (e *env) msg(conv uint64, sender, cmid, body string) store.Message {
	id := e.msgID.Add(1)
	return store.Message{
		ConvID:       conv,
		MsgID:        id<<22 | 1,
		Sender:       sender,
		SenderDevice: "phone",
		ClientMsgID:  cmid,
		Kind:         "text",
		Body:         body,
		ServerTime:   baseTime + int64(id),
	}
}

// group creates a group conversation with the given members (JoinSeq 1).
func (e *env) group(t *testing.T, id uint64, users ...string) {
	t.Helper()
	members := make([]store.Member, len(users))
	for i, u := range users {
		members[i] = store.Member{UserID: u, Role: store.RoleMember}
	}
	c := store.Conversation{ID: id, Kind: store.Group, Name: fmt.Sprintf("group %d", id), CreatedAt: baseTime}
	if err := e.s.CreateConversation(context.Background(), c, members); err != nil {
		t.Fatalf("CreateConversation(%d): %v", id, err)
	}
}

// send appends n messages from sender and returns them.
func (e *env) send(t *testing.T, conv uint64, sender string, n int) []store.Message {
	t.Helper()
	out := make([]store.Message, 0, n)
	for i := range n {
		m := e.msg(conv, sender, fmt.Sprintf("%s-%d", sender, e.msgID.Load()), fmt.Sprintf("body %d", i))
		res, err := e.s.Append(context.Background(), store.Append{Msg: m})
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		out = append(out, res.Msg)
	}
	return out
}

func (e *env) lastSeq(t *testing.T, conv uint64) uint64 {
	t.Helper()
	c, err := e.s.Conversation(context.Background(), conv)
	if err != nil {
		t.Fatalf("Conversation(%d): %v", conv, err)
	}
	return c.LastSeq
}

// seqs returns the seqs of msgs.
func seqs(msgs []store.Message) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Seq
	}
	return out
}

// span returns lo..hi, or nil if lo > hi.
func span(lo, hi uint64) []uint64 {
	var out []uint64
	for s := lo; s <= hi; s++ {
		out = append(out, s)
	}
	return out
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// sameMsg compares messages field by field; a nil and an empty Mentions are
// equal, since engines may read back either.
func sameMsg(a, b store.Message) bool {
	if !slices.Equal(a.Mentions, b.Mentions) {
		return false
	}
	a.Mentions, b.Mentions = nil, nil
	return reflect.DeepEqual(a, b)
}

// wantErr fails unless errors.Is(err, want).
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}
