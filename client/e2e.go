package client

import (
	"context"
	"slices"

	"github.com/parley-im/parley/protocol"
)

// End-to-end encryption requests. The encryption itself is in package
// client/e2ee and its glue to this client in client/e2eechat; these only
// carry frames.

// OpenDirectE2E returns the end-to-end encrypted direct conversation with
// peer (distinct from the plaintext one), creating it the first time.
func (c *Client) OpenDirectE2E(ctx context.Context, peer string) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeOpenDirect, Peer: peer, E2E: true}, idempotent)
}

// CreateGroupE2E creates an end-to-end encrypted group; retried like
// CreateGroup.
func (c *Client) CreateGroupE2E(ctx context.Context, name string, members []string) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeCreateGroup, Name: name, Members: slices.Clone(members), E2E: true}, once)
}

// UploadKeys publishes this device's keys (keys_upload) and returns the
// one-time prekey counts the server now holds. Repeating an upload stores
// the same keys again, so it is retried.
func (c *Client) UploadKeys(ctx context.Context, k protocol.KeyUpload) (protocol.KeyCounts, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKeysUpload, Keys: &k}, protocol.TypeKeys, idempotent)
	if err != nil {
		return protocol.KeyCounts{}, err
	}
	if r.KeyCounts == nil {
		return protocol.KeyCounts{}, nil
	}
	return *r.KeyCounts, nil
}

// FetchBundles fetches the bundle of user's device, or of every device of
// user (except this one) when device is "". Each fetch consumes one-time
// prekeys, so it is not repeated after an unknown outcome.
func (c *Client) FetchBundles(ctx context.Context, user, device string) ([]protocol.KeyBundle, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKeysBundle, UserID: user, DeviceID: device}, protocol.TypeBundles, once)
	if err != nil {
		return nil, err
	}
	return r.Bundles, nil
}

// KeyDevices lists user's devices that have keys.
func (c *Client) KeyDevices(ctx context.Context, user string) ([]protocol.DeviceKeyInfo, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeKeysDevices, UserID: user}, protocol.TypeDevices, idempotent)
	if err != nil {
		return nil, err
	}
	return r.Devices, nil
}

// SendFrame sends a send/edit frame as given (for callers that build
// bodies themselves, like client/e2eechat) and waits for the ack.
func (c *Client) SendFrame(ctx context.Context, f protocol.Frame) (Ack, error) {
	if f.ClientMsgID == "" {
		f.ClientMsgID = NewClientMsgID()
	}
	return c.write(ctx, f)
}

// ConvInfo reads conversation convID (members included, up to 1,000)
// without changing it.
func (c *Client) ConvInfo(ctx context.Context, convID uint64) (protocol.ConvInfo, error) {
	return c.conv(ctx, protocol.Frame{Type: protocol.TypeConvInfo, ConvID: convID}, idempotent)
}
