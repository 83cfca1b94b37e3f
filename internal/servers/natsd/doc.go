// Command natsd runs a nats-server with JetStream on 127.0.0.1 as its own process, one node of
// a cluster or a server alone (with an MQTT listener if asked): StartNATSCluster and
// StartNATSProcess (internal/servers) build it once and start it, so that a test can kill it with
// SIGKILL as a crash would. It is test infrastructure, not part of sigwatch.
//
// It logs to stderr and shuts down cleanly on SIGTERM or SIGINT.
//
// Files:
//
//   - main.go: the command: flags, the server, shutdown on a signal.
package main
