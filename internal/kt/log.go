// Package kt is the server's key transparency log: every change of a
// user's key-directory state becomes a leaf (protocol/kt's Entry) of an
// append-only Merkle log kept in the store (store.KT), whose signed
// checkpoints and proofs the chat service attaches to its key answers and
// serves to clients and outside auditors.
//
// Every chat process keeps the whole tree in memory (protocol/kt's Tree,
// about 64 bytes a leaf, plus the latest entry's encoding of each label:
// about 500 bytes a user of two devices, 0.5 GB a million users), rebuilt
// from the store when it opens and caught up from the store before each
// answer, so processes that append to one store answer from one log. An
// append writes leaf n only if index n is free (store.KTAppend's
// conditional write): of two processes appending at once one wins, the
// other catches up and appends after it, so the log cannot fork.
//
// A Log is safe for concurrent use.
package kt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/parley-im/parley/internal/settings"
	"github.com/parley-im/parley/internal/store"
	"github.com/parley-im/parley/protocol"
	pkt "github.com/parley-im/parley/protocol/kt"
)

// Config is the log's configuration (the server's kt. settings).
type Config struct {
	Enabled bool   `yaml:"enabled" help:"keep the key transparency log and attach its proofs to bundles and devices answers (off: no kt field, kt_* frames answer not_found)"`
	Origin  string `yaml:"origin" help:"the checkpoint origin (the log's name) given to the keys a deployment creates on its first start (empty: parley, in cluster mode parley/<cluster.namespace>); stored keys keep theirs"`
	// The public HTTP GETs (/v1/kt/...) are limited per source address.
	HTTPRate  float64 `yaml:"http_rate" help:"requests per second one source address may make to the public /v1/kt/ endpoints"`
	HTTPBurst int     `yaml:"http_burst" help:"burst of the public /v1/kt/ endpoints per source address"`
}

// DefaultConfig is the log's default configuration.
func DefaultConfig() Config {
	return Config{Enabled: true, HTTPRate: 20, HTTPBurst: 200}
}

// Validate reports a configuration Open would refuse.
func (c Config) Validate() error {
	var p settings.Problems
	p.Check(c.HTTPRate > 0, "http_rate", "must be positive, got %v", c.HTTPRate)
	p.Check(c.HTTPBurst >= 1, "http_burst", "must be at least 1, got %d", c.HTTPBurst)
	return p.Err("kt")
}

// maxPageBytes bounds the entry bytes of one leaves page past its first
// entry (docs/protocol.md, kt_leaves).
const maxPageBytes = 512 << 10

// maxAppendTries bounds how often an append retries after losing its
// index to another writer.
const maxAppendTries = 32

// keySet is the stored form of a deployment's keys.
type keySet struct {
	NoteSKey string `json:"note_skey"`
	NoteVKey string `json:"note_vkey"`
	VRFSeed  []byte `json:"vrf_seed"`
}

// latest is a label's last entry in the log: its index and encoding
// (decoded when compared, to keep a process's memory at the encodings).
type latest struct {
	index uint64
	leaf  []byte
}

// Log is a deployment's key transparency log as one process sees it.
type Log struct {
	st     store.Store
	log    *slog.Logger
	now    func() time.Time
	signer note.Signer
	keys   protocol.KTKeys
	vrf    *pkt.VRFPrivateKey

	// mu guards the tree, labels and lastTime: appends and catching up
	// hold it across their store call, so one process never writes
	// below its own tree's size. caughtUp is when the last catch-up
	// started: a caller that arrived before it need not read again.
	mu       sync.Mutex
	tree     *pkt.Tree
	labels   map[[32]byte]latest
	lastTime int64
	caughtUp time.Time

	// cp is the signed checkpoint of cpSize leaves (signatures are
	// deterministic, so every process signs the same text for a size).
	cpMu   sync.Mutex
	cpSize uint64
	cp     string

	labelMu    sync.Mutex
	labelCache map[string]userLabel
}

type userLabel struct {
	label [32]byte
	proof []byte
}

// maxLabelCache bounds the cache of users' VRF labels and proofs (a proof
// costs about as much as a signature; an entry about 200 bytes).
const maxLabelCache = 100_000

// Deps are what a Log runs on.
type Deps struct {
	Store  store.Store
	Logger *slog.Logger
	Now    func() time.Time
}

// Open loads (or, on a deployment's first start, creates) the log's keys
// and rebuilds the tree from the store's leaves. origin names fresh keys.
func Open(ctx context.Context, origin string, d Deps) (*Log, error) {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if origin == "" {
		origin = "parley"
	}
	skey, vkey, vrf, err := pkt.GenerateKeys(origin)
	if err != nil {
		return nil, err
	}
	fresh, _ := json.Marshal(keySet{NoteSKey: skey, NoteVKey: vkey, VRFSeed: vrf.Seed()})
	raw, err := d.Store.KTKeys(ctx, fresh)
	if err != nil {
		return nil, fmt.Errorf("kt: keys: %w", err)
	}
	var ks keySet
	if err := json.Unmarshal(raw, &ks); err != nil {
		return nil, fmt.Errorf("kt: stored keys do not decode: %w", err)
	}
	signer, err := note.NewSigner(ks.NoteSKey)
	if err != nil {
		return nil, fmt.Errorf("kt: stored note key: %w", err)
	}
	if _, err := note.NewVerifier(ks.NoteVKey); err != nil {
		return nil, fmt.Errorf("kt: stored note verifier key: %w", err)
	}
	vrf, err = pkt.NewVRFPrivateKey(ks.VRFSeed)
	if err != nil {
		return nil, fmt.Errorf("kt: stored VRF key: %w", err)
	}
	pub := vrf.Public()
	l := &Log{st: d.Store, log: d.Logger, now: d.Now, signer: signer, vrf: vrf,
		keys:   protocol.KTKeys{Origin: signer.Name(), NoteKey: ks.NoteVKey, VRFKey: pub[:]},
		tree:   pkt.NewTree(),
		labels: map[[32]byte]latest{}, labelCache: map[string]userLabel{}}
	if signer.Name() != origin {
		l.log.Info("kt: the stored keys keep their origin", "origin", signer.Name(), "configured", origin)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.catchUp(ctx); err != nil {
		return nil, err
	}
	l.log.Info("kt: log loaded", "origin", signer.Name(), "size", l.tree.Size(), "labels", len(l.labels))
	return l, nil
}

// Keys are the log's public keys (the kt_keys answer).
func (l *Log) Keys() protocol.KTKeys { return l.keys }

// Size is the number of leaves this process has seen.
func (l *Log) Size() uint64 { return l.tree.Size() }

// catchUp reads the leaves other processes appended past the tree's size.
// l.mu is held.
func (l *Log) catchUp(ctx context.Context) error {
	l.caughtUp = time.Now()
	for {
		page, err := l.st.KTLeaves(ctx, l.tree.Size(), store.MaxKTPage)
		if err != nil {
			return fmt.Errorf("kt: catch up: %w", err)
		}
		for _, leaf := range page {
			if err := l.add(leaf); err != nil {
				return err
			}
		}
		if len(page) < store.MaxKTPage {
			return nil
		}
	}
}

// add puts a stored leaf into the tree. A leaf that does not decode is a
// broken store: the process refuses to serve a log it cannot vouch for.
func (l *Log) add(leaf []byte) error {
	e, err := pkt.UnmarshalEntry(leaf)
	if err != nil {
		return fmt.Errorf("kt: leaf %d in the store: %w", l.tree.Size(), err)
	}
	index := l.tree.Append(leaf)
	l.labels[e.Label] = latest{index: index, leaf: leaf}
	l.lastTime = max(l.lastTime, e.Time)
	return nil
}

// fresh catches up unless a catch-up started after since finished.
// l.mu is held.
func (l *Log) fresh(ctx context.Context, since time.Time) error {
	if l.caughtUp.After(since) {
		return nil
	}
	return l.catchUp(ctx)
}

// label returns user's VRF label and its proof.
func (l *Log) label(user string) userLabel {
	l.labelMu.Lock()
	ul, ok := l.labelCache[user]
	l.labelMu.Unlock()
	if ok {
		return ul
	}
	ul.label, ul.proof = pkt.LabelFor(l.vrf, user)
	l.labelMu.Lock()
	if len(l.labelCache) >= maxLabelCache {
		clear(l.labelCache)
	}
	l.labelCache[user] = ul
	l.labelMu.Unlock()
	return ul
}

// State is the entry content of a user's directory state: the devices
// sorted by id with their identity keys and certificate signatures, and
// the account key (of the most recently updated device that has one; a
// user's devices share one). No device: no account key.
func State(devs []store.DeviceKeys) (account []byte, devices []pkt.EntryDevice) {
	var newest int64 = -1
	for _, d := range devs {
		devices = append(devices, pkt.EntryDevice{ID: d.DeviceID, IdentityKey: d.IdentityKey, Sig: d.DeviceSig})
		if len(d.AccountKey) > 0 && d.UpdatedAt > newest {
			account, newest = d.AccountKey, d.UpdatedAt
		}
	}
	slices.SortFunc(devices, func(a, b pkt.EntryDevice) int { return strings.Compare(a.ID, b.ID) })
	return account, devices
}

func sameState(e pkt.Entry, account []byte, devices []pkt.EntryDevice) bool {
	if !bytes.Equal(e.Account, account) || len(e.Devices) != len(devices) {
		return false
	}
	for i, d := range devices {
		o := e.Devices[i]
		if o.ID != d.ID || !bytes.Equal(o.IdentityKey, d.IdentityKey) || !bytes.Equal(o.Sig, d.Sig) {
			return false
		}
	}
	return true
}

// Ensure makes the user's latest entry the directory's current state,
// appending an entry if the log's differs — after a change, or to heal a
// crash between a directory write and its append — and returns the kt
// object of an answer about the user: the current checkpoint, the user's
// label and VRF proof, and the latest entry with its inclusion proof (none
// for a user never in the log who has no device).
//
// devs is the user's devices as the caller read them; read reads them
// again. An entry is only appended from a read made after catching up
// with the log, so a process holding an older read cannot append a state
// older than one another process appended: it reads again first.
func (l *Log) Ensure(ctx context.Context, user string, devs []store.DeviceKeys, read func(context.Context) ([]store.DeviceKeys, error)) (*protocol.KTProof, error) {
	ul := l.label(user)
	account, devices := State(devs)
	arrived := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.fresh(ctx, arrived); err != nil {
		return nil, err
	}
	reread := false
	for try := 0; ; try++ {
		cur, found := l.labels[ul.label]
		var last pkt.Entry
		if found {
			var err error
			if last, err = pkt.UnmarshalEntry(cur.leaf); err != nil {
				return nil, fmt.Errorf("kt: leaf %d: %w", cur.index, err)
			}
		}
		if (found && sameState(last, account, devices)) || (!found && len(devices) == 0) {
			break
		}
		if !reread {
			d, err := read(ctx)
			if err != nil {
				return nil, fmt.Errorf("kt: read %s's devices: %w", user, err)
			}
			account, devices = State(d)
			reread = true
			continue
		}
		e := pkt.Entry{Label: ul.label, Version: 1, Time: max(l.now().UnixMilli(), l.lastTime),
			Account: account, Devices: devices}
		if found {
			e.Version, e.Prev = last.Version+1, pkt.EntryHash(cur.leaf)
		}
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("kt: %s's state is no valid entry: %w", user, err)
		}
		leaf := e.Marshal()
		err := l.st.KTAppend(ctx, l.tree.Size(), leaf)
		if err == nil {
			index := l.tree.Append(leaf)
			l.labels[e.Label] = latest{index: index, leaf: leaf}
			l.lastTime = e.Time
			break
		}
		if !errors.Is(err, store.ErrConflict) || try >= maxAppendTries {
			return nil, fmt.Errorf("kt: append: %w", err)
		}
		// Another process appended at this index: read what it wrote
		// (perhaps this very state), then the directory again.
		if err := l.catchUp(ctx); err != nil {
			return nil, err
		}
		reread = false
	}
	size := l.tree.Size()
	p := &protocol.KTProof{Label: ul.label[:], VRFProof: ul.proof}
	if cur, found := l.labels[ul.label]; found {
		proof, err := l.tree.InclusionProof(cur.index, size)
		if err != nil {
			return nil, fmt.Errorf("kt: inclusion proof: %w", err)
		}
		p.Index, p.Entry, p.Proof = cur.index, cur.leaf, proof
	}
	cp, err := l.checkpoint(size)
	if err != nil {
		return nil, err
	}
	p.Checkpoint = cp
	return p, nil
}

// checkpoint returns the signed checkpoint of the tree's first size
// leaves (size ≤ the tree's size).
func (l *Log) checkpoint(size uint64) (string, error) {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	if l.cp != "" && l.cpSize == size {
		return l.cp, nil
	}
	root, err := l.tree.RootAt(size)
	if err != nil {
		return "", fmt.Errorf("kt: root: %w", err)
	}
	text, err := pkt.SignCheckpoint(l.signer, pkt.Checkpoint{Origin: l.signer.Name(), Size: size, Root: root})
	if err != nil {
		return "", err
	}
	if size >= l.cpSize {
		l.cpSize, l.cp = size, string(text)
	}
	return string(text), nil
}

// Checkpoint returns the current signed checkpoint, after catching up.
func (l *Log) Checkpoint(ctx context.Context) (*protocol.KTProof, error) {
	size, err := l.current(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := l.checkpoint(size)
	if err != nil {
		return nil, err
	}
	return &protocol.KTProof{Checkpoint: cp}, nil
}

// current catches up and returns the tree's size.
func (l *Log) current(ctx context.Context) (uint64, error) {
	arrived := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.fresh(ctx, arrived); err != nil {
		return 0, err
	}
	return l.tree.Size(), nil
}

// Consistency answers kt_consistency: the current checkpoint and the
// consistency proof from size from to size to (0 < from ≤ to ≤ the
// current size; otherwise a *protocol.Error, invalid_argument).
func (l *Log) Consistency(ctx context.Context, from, to uint64) (*protocol.KTProof, error) {
	size, err := l.current(ctx)
	if err != nil {
		return nil, err
	}
	if from == 0 || from > to || to > size {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "kt_consistency needs 0 < from <= to <= %d (the log's size)", size)
	}
	proof, err := l.tree.ConsistencyProof(from, to)
	if err != nil {
		return nil, fmt.Errorf("kt: consistency proof: %w", err)
	}
	cp, err := l.checkpoint(size)
	if err != nil {
		return nil, err
	}
	return &protocol.KTProof{Checkpoint: cp, Proof: proof}, nil
}

// Leaves answers kt_leaves: the current checkpoint and the leaves from
// from on, at most limit (0: protocol.MaxKTLeaves) and, past the first,
// at most maxPageBytes of them; from past the size is a *protocol.Error.
func (l *Log) Leaves(ctx context.Context, from uint64, limit int) (*protocol.KTProof, error) {
	if limit <= 0 || limit > protocol.MaxKTLeaves {
		limit = protocol.MaxKTLeaves
	}
	size, err := l.current(ctx)
	if err != nil {
		return nil, err
	}
	if from > size {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "from %d is past the log's size %d", from, size)
	}
	n := int(min(uint64(limit), size-from))
	var page [][]byte
	if n > 0 {
		page, err = l.st.KTLeaves(ctx, from, n)
		if err != nil {
			return nil, fmt.Errorf("kt: leaves: %w", err)
		}
	}
	total := 0
	for i, leaf := range page {
		total += len(leaf)
		if i > 0 && total > maxPageBytes {
			page = page[:i]
			break
		}
	}
	cp, err := l.checkpoint(size)
	if err != nil {
		return nil, err
	}
	return &protocol.KTProof{Checkpoint: cp, From: from, Entries: page}, nil
}
