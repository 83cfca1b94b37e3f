//go:build !demo

package main

import (
	"context"
	"errors"
	"io"
)

// cmdDemo stands in for the demo in the service binary. The demo embeds
// nats-server and starts Redis and Mosquitto, which the service has no use
// for, so only a build with the demo tag (demo.go) carries it.
func cmdDemo(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("demo: this binary was built without the demo; run `make demo` " +
		"(go run -tags demo ./cmd/sigwatch demo)")
}

// cmdDev stands in for `sigwatch dev`, which starts the servers the demo
// starts.
func cmdDev(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("dev: this binary was built without the servers it starts; run `make run` " +
		"(go build -tags demo -o bin/sigwatch ./cmd/sigwatch && bin/sigwatch dev)")
}
