package dispatch

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestEventStreamLeavesTimerResetsToTheirOwn shows that an event stream
// created on the whole prefix (as sigwatch did before timer resets had a
// stream of their own) is moved to the event subjects at start, keeping
// its events, so the work-queue stream of resets can be created beside it
// and a reset is never stored among the events.
func TestEventStreamLeavesTimerResetsToTheirOwn(t *testing.T) {
	ctx := context.Background()
	nc, js := natsConn(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SIGWATCH", Subjects: []string{"sigwatch.>"},
		Duplicates: 2 * time.Minute, MaxAge: DefaultMaxAge}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "sigwatch.lost.meter", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, nc, Options{AckWait: time.Second})
	s, err := js.Stream(ctx, "SIGWATCH")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Subjects; !slices.Equal(got, p.Subjects().Stream()) {
		t.Fatalf("event stream subjects %v, want %v", got, p.Subjects().Stream())
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("%d events kept, want 1", n)
	}
	if _, err := p.TimerResets(ctx, time.Second, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, p.Subjects().TimerSet("jobs"), []byte(`{"id":"a","after":"1s"}`)); err != nil {
		t.Fatal(err)
	}
	n, oldest, err := p.TimerBacklog(ctx)
	if err != nil || n != 1 || time.Since(oldest) > time.Minute {
		t.Fatalf("backlog %d since %v: %v", n, oldest, err)
	}
	s, _ = js.Stream(ctx, "SIGWATCH")
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("the reset went into the event stream: %d messages", n)
	}
	// A second start finds everything in place.
	if _, err := New(ctx, nc, Options{AckWait: time.Second}); err != nil {
		t.Fatal(err)
	}
}
