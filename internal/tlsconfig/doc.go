// Package tlsconfig is the client TLS section every connection of sigwatch
// shares (Redis, NATS, MQTT): one YAML shape, one way to build it; and the
// TLS of sigwatch's own HTTPS server, its certificate read again when its
// files change.
//
// Files:
//
//   - tlsconfig.go: Config and Build, the *tls.Config it makes.
//   - server.go: Server, a server certificate (and client CAs) reloaded
//     when the files change on disk or on Reload (SIGHUP).
package tlsconfig
