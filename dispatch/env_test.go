package dispatch

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// natsConn returns a connection to a fresh single nats-server, and
// JetStream on it for reading back what a publisher stored.
func natsConn(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := testenv.New(t, testenv.Options{NATS: true}).Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// newPublisher returns a publisher with opts on nc, failing the test if
// it cannot start.
func newPublisher(t testing.TB, nc *nats.Conn, opts Options) *Bus {
	t.Helper()
	p, err := New(context.Background(), nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
