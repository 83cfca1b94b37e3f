package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sigwatch/sigwatch/client"
)

// A checkout arms a payment timer per order, pushes it back while the
// customer is active, cancels it when the order is paid, and a billing
// worker handles the orders that timed out.
func Example() {
	ctx := context.Background()
	c, err := client.New(client.Options{URL: sigwatchURL, NATS: natsConn})
	if err != nil {
		panic(err)
	}

	timedOut := make(chan client.Event, 2)
	sub, err := c.Subscribe(ctx, "payments", "billing", func(ctx context.Context, ev client.Event) error {
		timedOut <- ev
		return nil
	})
	if err != nil {
		panic(err)
	}
	defer sub.Stop()

	type order struct {
		Customer int `json:"customer"`
	}
	// Two orders wait for payment.
	if _, err := c.Reset(ctx, "payments", "order-1", 300*time.Millisecond, order{Customer: 7}); err != nil {
		panic(err)
	}
	if _, err := c.Reset(ctx, "payments", "order-2", 300*time.Millisecond, order{Customer: 8}); err != nil {
		panic(err)
	}
	// The customer of order 2 is still at it: its timer is pushed back.
	t, err := c.Reset(ctx, "payments", "order-2", 600*time.Millisecond, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("order-2 pushed back:", time.Until(t.At()) > 400*time.Millisecond)
	// Order 1 is paid.
	cancelled, err := c.Cancel(ctx, "payments", "order-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("order-1 cancelled:", cancelled)
	_, armed, err := c.Get(ctx, "payments", "order-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("order-1 still armed:", armed)

	ev := <-timedOut
	var o order
	if err := ev.Decode(&o); err != nil {
		panic(err)
	}
	fmt.Printf("%s timed out, customer %d, not early: %v\n", ev.Timer, o.Customer, ev.FiredAt >= ev.Deadline)
	select {
	case ev := <-timedOut:
		fmt.Println("unexpected:", ev.Timer)
	case <-time.After(500 * time.Millisecond):
	}
	// Output:
	// order-2 pushed back: true
	// order-1 cancelled: true
	// order-1 still armed: false
	// order-2 timed out, customer 8, not early: true
}
