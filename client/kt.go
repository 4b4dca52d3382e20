package client

import (
	"context"
	"fmt"

	"github.com/parley-im/parley/protocol"
)

// Key transparency requests. They only carry frames: client/e2eechat
// verifies what they return (signatures, proofs, consistency) with
// protocol/kt.

// FetchBundlesKT is FetchBundles with the answer's kt object: the asked
// user's latest log entry and its inclusion proof (nil when the server
// keeps no log).
func (c *Client) FetchBundlesKT(ctx context.Context, user, device string) ([]protocol.KeyBundle, *protocol.KTProof, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKeysBundle, UserID: user, DeviceID: device}, protocol.TypeBundles, once)
	if err != nil {
		return nil, nil, err
	}
	return r.Bundles, r.KT, nil
}

// KeyDevicesKT is KeyDevices with the answer's kt object (nil when the
// server keeps no log).
func (c *Client) KeyDevicesKT(ctx context.Context, user string) ([]protocol.DeviceKeyInfo, *protocol.KTProof, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKeysDevices, UserID: user}, protocol.TypeDevices, idempotent)
	if err != nil {
		return nil, nil, err
	}
	return r.Devices, r.KT, nil
}

// KTKeys fetches the key transparency log's public keys (kt_keys). A
// server that keeps no log answers not_found.
func (c *Client) KTKeys(ctx context.Context) (protocol.KTKeys, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKTKeys}, protocol.TypeKTKeys, idempotent)
	if err != nil {
		return protocol.KTKeys{}, err
	}
	if r.KTKeys == nil {
		return protocol.KTKeys{}, fmt.Errorf("%s: answer without kt_keys", protocol.TypeKTKeys)
	}
	return *r.KTKeys, nil
}

// KTConsistency fetches the log's current checkpoint and the consistency
// proof from size from to size to (0 < from <= to <= the log's size).
func (c *Client) KTConsistency(ctx context.Context, from, to uint64) (protocol.KTProof, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKTConsistency, From: from, To: to}, protocol.TypeKTProof, idempotent)
	if err != nil {
		return protocol.KTProof{}, err
	}
	if r.KT == nil {
		return protocol.KTProof{}, fmt.Errorf("%s: answer without kt", protocol.TypeKTConsistency)
	}
	return *r.KT, nil
}

// KTLeaves fetches the log's current checkpoint and up to limit leaves
// from index from (limit 0: the server's page, protocol.MaxKTLeaves).
func (c *Client) KTLeaves(ctx context.Context, from uint64, limit int) (protocol.KTProof, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKTLeaves, From: from, Limit: limit}, protocol.TypeKTLeaves, idempotent)
	if err != nil {
		return protocol.KTProof{}, err
	}
	if r.KT == nil {
		return protocol.KTProof{}, fmt.Errorf("%s: answer without kt", protocol.TypeKTLeaves)
	}
	return *r.KT, nil
}
