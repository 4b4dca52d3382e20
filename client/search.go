package client

import (
	"context"

	"github.com/parley-im/parley/protocol"
)

// Search finds messages of the plain conversations the user is a member
// of (within its membership windows) whose text holds q.Text as a phrase;
// Chinese and other CJK text match as exact character sequences. Pass the
// result's Cursor in q.Cursor for the next page. End-to-end encrypted
// conversations are never on the server: e2eechat.Messenger.Search finds
// them on the device.
func (c *Client) Search(ctx context.Context, q protocol.SearchQuery) (protocol.SearchResult, error) {
	r, _, err := c.do(ctx, protocol.Frame{Type: protocol.TypeSearch, Query: &q}, protocol.TypeSearch, idempotent)
	if err != nil {
		return protocol.SearchResult{}, err
	}
	if r.Search == nil {
		return protocol.SearchResult{}, nil
	}
	return *r.Search, nil
}
