// Package client is Parley's Go client SDK: it keeps one WebSocket connection
// to a Parley server alive, turns the server's push stream into an ordered,
// gap-free, duplicate-free stream of events per conversation, and offers the
// requests of the wire protocol with retries that never create a second
// message.
//
// # Frames and methods
//
// Every client frame of docs/protocol.md has a method (or is sent by the
// client itself), and every push an event:
//
//	ping            Ping (and automatic heartbeats)
//	send            Send, SendWithID, SendWith (mentions, @everyone), SendState (kind state, coalesce_key)
//	edit, recall    Edit, Recall
//	delivered       automatic, after the application has taken messages
//	read            MarkRead
//	sync            automatic on every (re)connect; Sync
//	history         History (and automatic gap filling)
//	conv_list       Conversations
//	open_direct     OpenDirect, OpenDirectE2E
//	create_group    CreateGroup, CreateGroupE2E
//	add_members     AddMembers
//	remove_members  RemoveMembers
//	leave           Leave
//	set_role        SetRole
//	mute            Mute
//	presence_sub    WatchPresence (sent again after every reconnect)
//	typing          Typing
//	conv_info       ConvInfo
//	keys_upload     UploadKeys          (end-to-end encryption: client/e2eechat)
//	keys_bundle     FetchBundles
//	keys_devices    KeyDevices
//	keys_remove     RemoveKeys
//	upload_create   UploadCreate, Upload (declare, PUT every part, complete; attach.go)
//	upload_status   UploadStatus, ResumeUpload
//	upload_part     UploadPart
//	upload_complete UploadComplete
//	send (file)     SendFile, SendFileWithID (ParseFileBody reads the body)
//	attachment_url  AttachmentURL, Download (GET with Range, a thumbnail)
//
//	msg → EventMessage (system bodies: ParseSystemEvent), receipt → EventReceipt,
//	presence → EventPresence, typing → EventTyping, keys_low → EventKeysLow,
//	hello → EventConnected, goaway → handled (the client moves on).
//
// A request the server refuses returns a *Error whose Code is the
// protocol's error code (CodeOf(err) extracts it, also from an error that
// wraps one); retryable codes (rate_limited, overloaded,
// store_unavailable, internal, timeout) are retried until the context
// ends, after retry_after_ms when the server gives one, and the final
// error then wraps both the context's error and the last *Error.
//
// # Lifecycle
//
// New builds a Client; Run connects and keeps the connection alive (jittered
// exponential backoff with full jitter, honouring the server's goaway and
// Retry-After) until its context is done or Close is called. Run stops on its
// own only for conditions a retry cannot fix: a refused token (ErrUnauthorized),
// a banned user (ErrBanned: close code 4003 or a 403 banned handshake), a
// newer connection of the same user and device (ErrReplaced), or a request
// the server rejects as malformed.
//
// When the server ends a connection because its token expired (4001,
// ErrTokenExpired) or was revoked by the operator (4002, ErrTokenRevoked),
// a client with Config.TokenFunc asks it for a token and reconnects after
// the first backoff step; with a fixed Config.Token, or when TokenFunc
// returns the same token, Run stops with an error wrapping that sentinel and
// ErrUnauthorized, without sending the dead token again. An operator's
// disconnect (4004, ErrKicked) reconnects with backoff. EventDisconnected
// carries these errors, so an application can tell the user why.
//
// # Clusters
//
// Config.URLs lists several gateways. The client starts at a random one and
// every later connection attempt (after a drop, a refused or failed dial, a
// 1001 close or a goaway) goes to the next in turn, so a population of
// clients spreads over the gateways and leaves a dead or draining one on its
// next attempt. A goaway does not end the connection at once: the client
// keeps using it until the delay the node asked for (plus jitter) is over,
// then closes it and connects to the next gateway; if the node closes first,
// the client still waits out the rest of that delay.
//
// # Delivery guarantees
//
// On every (re)connect the client first sends one sync request carrying the
// last seq it has seen of every conversation, applies the snapshot, and only
// then looks at pushes; EventConnected follows the snapshot's events. Per conversation, messages reach the application in
// strictly increasing seq, each once and without holes: a push at or below
// the last seen seq is dropped; a push past a hole is held while the hole is
// fetched with history. The one permitted jump is a snapshot that reports
// more_unread (the conversation was too far behind); the application is told
// how many messages were skipped and can page them with History. Every
// conversation's stream starts with an EventSnapshot naming its starting
// point (FromSeq): from the sync, or, for a conversation the sync did not
// return and first seen through a push, from the conversation list (the
// read position, which the user's own sends move, or just before the first
// message pushed if that is lower). After the
// application has taken messages the client records their seq in the
// StateStore and acknowledges them as each push's ack policy says: within
// ~100ms for direct conversations and small groups, within ~1s for medium
// groups (ack "batch"), never for large ones (ack "none": their gaps are
// filled by seq); every position due goes in one delivered frame.
//
// # Events and slow applications
//
// Events returns one channel carrying every event in order. It has
// Config.EventBuffer slots. When the application falls behind, the client's
// dispatcher waits for it, and pushes that arrive meanwhile are dropped by the
// reader instead of blocking it; once the application catches up, the client
// re-fetches everything it dropped (conversation list + history), so nothing
// is lost or repeated (receipts dropped this way are not replayed;
// Conversations has the read positions). Request/response handling never waits for the
// application, so calling Send from the goroutine that drains Events cannot
// deadlock. The channel is closed when Run returns (or by Close if Run was
// never started).
//
// # Concurrency
//
// All methods are safe for concurrent use. Per connection the client runs one
// reader, one writer and one dispatcher goroutine; Run owns them and waits
// for all of them before it reconnects or returns. Close is idempotent and
// returns after Run has returned.
package client
