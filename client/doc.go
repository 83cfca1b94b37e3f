// Package client is the Go client of sigwatch's generic timers: what a
// business service imports to arm, push back, read and cancel timers, to
// publish resets at a high rate over NATS, and to handle the events of the
// timers that fired.
//
//	c, _ := client.New(client.Options{URL: "http://127.0.0.1:8080", NATS: nc})
//	c.Reset(ctx, "orders", "o-1001", 15*time.Minute, map[string]any{"customer": 42})
//	c.Subscribe(ctx, "orders", "billing", func(ctx context.Context, ev client.Event) error { … })
//
// What lives where: client.go holds the HTTP calls and Publish, subscribe.go
// the event consumer.
package client
