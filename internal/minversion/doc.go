// Package minversion compares server versions ("7.0.15", "v2.9.10",
// "2.10.0-beta.1") with the oldest one sigwatch works with, so that shard
// (Redis) and dispatch (nats-server) refuse an old server at start by one
// rule.
//
// Files:
//
//   - minversion.go: AtLeast.
package minversion
