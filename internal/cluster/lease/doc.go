// Package lease holds cluster mode's leases in Redis: partition ownership
// with fencing epochs (Owner: one chat process writes a conversation's
// partition at a time) and Snowflake node numbers (NodeNumbers: no two
// live processes mint ids with the same node number).
//
// Owner and NodeNumbers are safe for concurrent use; their Run loops are
// owned by the caller's context and release their leases when it ends.
package lease
