package e2eechat

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/parley-im/parley/client/e2ee"
	"github.com/parley-im/parley/protocol"
)

// FuzzVerify feeds arbitrary contents (what a peer or a replaying server
// can put inside a ciphertext) and labels to the label checks: they
// refuse or accept, never panic, accept only a content that repeats every
// label and refuse it under a second seq.
func FuzzVerify(f *testing.F) {
	for i, c := range []content{
		{T: "text", Text: "hi", Conv: 7, Kind: protocol.KindText, From: "alice", Dev: "phone", Ctr: 1},
		{T: "text", Text: "hi", Conv: 7, Kind: protocol.KindEdit, Target: 3, From: "alice", Dev: "phone", Ctr: 2},
		{T: "recall", Conv: 7, Kind: protocol.KindRecall, Target: 3, From: "alice", Dev: "laptop", Ctr: 3},
		{T: "skdm", SKDM: []byte{1, 2}, Conv: 8, Kind: protocol.KindText, From: "bob", Dev: "phone", Ctr: 1, KT: &KTHead{Size: 1, Root: []byte{9}}},
		{T: "text", Text: "old"},
		{T: "file", Conv: 7, Kind: protocol.KindFile, From: "alice", Dev: "phone", Ctr: 4,
			File: &File{Name: "a.txt", Size: 3, Key: make([]byte, e2ee.AttachmentKeySize), Digest: strings.Repeat("ab", 32)}},
		{T: "file", Conv: 7, Kind: protocol.KindFile, From: "alice", Dev: "phone", Ctr: 5, File: &File{Key: []byte{1}}},
	} {
		b, _ := json.Marshal(c)
		kind := protocol.KindText
		if c.T == "file" {
			kind = protocol.KindFile
		}
		f.Add(b, uint64(7), uint64(5+i), "alice", "phone", kind, uint64(0), false)
	}
	self := e2ee.Address{User: "bob", Device: "phone"}
	f.Fuzz(func(t *testing.T, plain []byte, conv, seq uint64, sender, device, kind string, target uint64, edited bool) {
		var c content
		if seq == 0 || json.Unmarshal(plain, &c) != nil {
			return // seqs start at 1
		}
		m := &Messenger{st: e2ee.NewMemoryStore(), self: self, devs: map[string][]string{}}
		msg := protocol.Message{ConvID: conv, Seq: seq, Sender: sender, SenderDevice: device, Kind: kind, TargetSeq: target, Edited: edited}
		if err := m.check(msg, c, 0); err != nil {
			return
		}
		if c.Conv != conv || c.From != sender || c.Ctr == 0 {
			t.Fatalf("accepted %+v for %+v", c, msg)
		}
		if c.T == "file" && (c.File.valid() != nil || c.File.AttachmentID != msg.AttachmentID) {
			t.Fatalf("accepted a file content %+v for %+v", c.File, msg)
		}
		if !rewritten(msg, c) && (c.Dev != device || c.Kind != kind || c.Target != target) {
			t.Fatalf("accepted %+v for %+v", c, msg)
		}
		// The same content under another seq is a replay.
		first := msg.Seq
		msg.Seq++
		if !rewritten(msg, c) && m.check(msg, c, first) == nil {
			t.Fatalf("accepted %+v again at seq %d", c, msg.Seq)
		}
	})
}
