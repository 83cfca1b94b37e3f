package bench

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishAsync is js.PublishMsgAsync that waits for room when the client
// has its maximum of publishes in flight (a busy machine acknowledges
// slowly), instead of failing the scenario: back-pressure, as sigwatch's own
// publisher has.
func publishAsync(ctx context.Context, js jetstream.JetStream, m *nats.Msg, opts ...jetstream.PublishOpt) error {
	_, err := publishAsyncFuture(ctx, js, m, opts...)
	return err
}

// publishAsyncFuture is publishAsync that returns the publish's future.
func publishAsyncFuture(ctx context.Context, js jetstream.JetStream, m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	for {
		f, err := js.PublishMsgAsync(m, opts...)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}
