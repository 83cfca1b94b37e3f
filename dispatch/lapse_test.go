package dispatch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestLapsingFenceRefusedOnceLapsed proves what a lapsing fence stands on,
// against a real nats-server: a publish under a fresh lapsing fence is
// stored; once the fence's time to live has passed the stream refuses it
// (ErrFenced) with nobody else fencing, and a fence taken anew is stored
// under again.
func TestLapsingFenceRefusedOnceLapsed(t *testing.T) {
	ctx := context.Background()
	nc, _ := natsConn(t)
	p := newPublisher(t, nc, Options{AckWait: 2 * time.Second, Duplicates: 2 * time.Second})
	if ttl := LapseTTL(p.Duplicates()); ttl != time.Second {
		t.Fatalf("time to live for a 2s window = %v, want 1s", ttl)
	}
	l := p.Lapsing("notify", "a", 4)
	msg := func(id string) []Message {
		return []Message{{Subject: p.Subjects().Alarm("meter"), ID: id, Body: []byte(`{}`)}}
	}
	f, err := l.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.Subject == "" {
		t.Fatal("a lapsing fence on a JetStream stream is the zero Fence")
	}
	if err := p.PublishFenced(ctx, f, msg("fresh"))[0]; err != nil {
		t.Fatalf("publish under a fresh fence: %v", err)
	}
	// The stream removes the fence within its time to live and a tick.
	start := time.Now()
	var refused time.Duration
	for k := 0; refused == 0 && time.Since(start) < 5*time.Second; k++ {
		time.Sleep(100 * time.Millisecond)
		err := p.PublishFenced(ctx, f, msg(fmt.Sprintf("late-%d", k)))[0]
		switch {
		case errors.Is(err, ErrFenced):
			refused = time.Since(start)
		case err != nil:
			t.Fatalf("publish under a lapsing fence: %v, want stored or ErrFenced", err)
		}
	}
	if refused == 0 || refused > 2*time.Second {
		t.Fatalf("fence with a 1s time to live refused after %v, want within 2s", refused)
	}
	g, err := l.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g == f {
		t.Fatal("Take gave the lapsed fence again")
	}
	if err := p.PublishFenced(ctx, g, msg("renewed")); err[0] != nil {
		t.Fatalf("publish under a renewed fence: %v", err[0])
	}
	t.Logf("lapsing fence refused %v after its first publish", refused)
}

// TestLapsingFenceCoreIsZero: core NATS cannot fence; Take says so with the
// zero Fence and publishing under it works as before.
func TestLapsingFenceCoreIsZero(t *testing.T) {
	nc, _ := natsConn(t)
	p := newPublisher(t, nc, Options{Mode: Core})
	f, err := p.Lapsing("notify", "a", 4).Take(context.Background())
	if err != nil || f != (Fence{}) {
		t.Fatalf("core: Take = %+v, %v, want the zero Fence", f, err)
	}
}
