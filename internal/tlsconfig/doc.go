// Package tlsconfig is the client TLS section every connection of sigwatch
// shares (Redis, NATS, MQTT): one YAML shape, one way to build it.
//
// Files:
//
//   - tlsconfig.go: Config and Build, the *tls.Config it makes.
package tlsconfig
