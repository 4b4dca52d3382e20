// Package route carries gateways' requests to the chat tier over NATS
// request/reply: Remote is a gateway's backend (writes go to the owner of
// the conversation's partition, the rest to any chat process), Serve
// answers them in a chat process with admission control, Routed splits a
// both-roles process between its own partitions and the others, and Admin
// runs the server API's conversation writes on the owner (admin.go: the
// admin envelope, on subjects gateways never use).
//
// All types are safe for concurrent use; Serve owns the goroutines it
// starts and waits for them when its context ends.
package route
