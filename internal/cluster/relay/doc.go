// Package relay is cluster mode's presence directory (presence.Directory)
// and its membership relay, over the session registry, Redis and core
// NATS (Relay).
//
// A user's online devices are the session registry's hash of the user
// (internal/registry/redis: entries live while their gateway's lease does,
// so a gateway killed without disconnecting loses its users once the
// lease lapses); last seen is a Redis key per user with a TTL
// (presence.last_seen_ttl). A gateway announces each connect and
// disconnect as a hint on the user's shard subject, <ns>.presence.s.<n>
// (n = hash(user) mod cluster.presence_shards); a process subscribes only
// to the shards of the users it follows, drops hints of users it does not
// follow, and reads a followed user's state from Redis when told of a
// change. No process holds the cluster's online users: a gateway holds
// the users its connections watch, a chat process the members of the
// groups it tracks (fanout.Roster).
//
// Hints are at most once. Followers read everyone they follow again after
// a NATS reconnect or dropped messages. Every cluster.presence_resync they
// read the lease epochs of the gateways their followed online users are
// on and read again the users of a gateway whose lease lapsed or changed
// (a gateway killed with -9 announces nothing).
//
// Relay is safe for concurrent use; its Run owns the goroutines it starts
// and returns when they have stopped.
package relay
