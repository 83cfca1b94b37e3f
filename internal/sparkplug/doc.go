// Package sparkplug is the Sparkplug B wire layer: its topics, and the few
// fields of its payloads that tell whether an edge node or device is alive
// (timestamp, seq, the bdSeq that ties a node's birth to its death).
//
// It is pure: no I/O, no state. ParseTopic allocates nothing; Decode reads
// the payload with the protobuf code generated from the specification's
// schema, never a hand-written decoder. The encoders (BirthPayload,
// DeviceBirthPayload, DeathPayload, DataPayload, StatePayload) are for
// clients and tests.
//
// Refusals are *InvalidError values with a stable Reason token, tested
// with errors.Is, as ingest's are.
//
// # Regenerating
//
// sparkplug_b.proto is Eclipse Tahu's sparkplug_b/sparkplug_b.proto as it
// is published, license header included; its Go package is given on the
// command line so that the file stays as published. With protoc and
// protoc-gen-go (the version of google.golang.org/protobuf in go.mod:
// go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12) on
// PATH, run `go generate ./internal/sparkplug`.
//
// Files:
//
//   - topic.go: Kind, Topic and ParseTopic.
//   - payload.go: Info and Decode; the protobuf encoders.
//   - state.go: the host application's JSON STATE payload.
//   - errors.go: InvalidError and the refusals.
//   - sparkplug_b.pb.go: generated from sparkplug_b.proto; do not edit.
package sparkplug

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go_opt=Msparkplug_b.proto=github.com/sigwatch/sigwatch/internal/sparkplug;sparkplug sparkplug_b.proto
