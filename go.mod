module github.com/sigwatch/sigwatch

go 1.26.8

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/nats-io/nats.go v1.55.0
	github.com/redis/rueidis v1.0.79
)

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
