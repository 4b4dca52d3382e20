package chat

import "strings"

// A coalesce key names one sender's state: alice's "red-packet-7" and
// bob's "red-packet-7" are two states, and neither can supersede the
// other's. The store indexes the key scoped by its sender ("alice/red-packet-7";
// user ids never contain '/'), and clients see the key as they sent it.

// scopedKey is the key the store indexes for a state message of sender.
func scopedKey(sender, key string) string {
	if key == "" {
		return ""
	}
	return sender + "/" + key
}

// clientKey is the key as its sender wrote it.
func clientKey(stored string) string {
	if _, key, ok := strings.Cut(stored, "/"); ok {
		return key
	}
	return stored
}
