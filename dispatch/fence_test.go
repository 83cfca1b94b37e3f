package dispatch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestFenceRefusesEarlierOwner proves the ground invariant 11 stands on,
// against a real nats-server: once a second owner has fenced a shard, the
// stream refuses every asynchronous publish fenced by the first owner,
// while the second owner's are stored and events of other shards are not
// disturbed.
func TestFenceRefusesEarlierOwner(t *testing.T) {
	ctx := context.Background()
	nc, js := natsConn(t)
	p := newPublisher(t, nc, Options{AckWait: 2 * time.Second})
	batch := func(from string, n int) []Message {
		msgs := make([]Message, n)
		for j := range msgs {
			id := fmt.Sprintf("%s-%03d@1", from, j)
			msgs[j] = Message{Subject: p.Subjects().Lost("meter"), ID: id, Body: []byte(`{}`)}
		}
		return msgs
	}

	a, err := p.Fence(ctx, "deadlines", 3, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	other, err := p.Fence(ctx, "deadlines", 4, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	for j, err := range p.PublishFenced(ctx, a, batch("a1", 50)) {
		if err != nil {
			t.Fatalf("owner a before b fenced, message %d: %v", j, err)
		}
	}
	b, err := p.Fence(ctx, "deadlines", 3, "b", 2)
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, err := range p.PublishFenced(ctx, a, batch("a2", 200)) {
		if errors.Is(err, ErrFenced) {
			refused++
		} else {
			t.Errorf("owner a after b fenced: got %v, want ErrFenced", err)
		}
	}
	for j, err := range p.PublishFenced(ctx, b, batch("b", 50)) {
		if err != nil {
			t.Fatalf("owner b, message %d: %v", j, err)
		}
	}
	for j, err := range p.PublishFenced(ctx, other, batch("other", 50)) {
		if err != nil {
			t.Fatalf("shard 4 (not fenced again), message %d: %v", j, err)
		}
	}
	ids := testenv.StreamMsgIDs(t, nc, "SIGWATCH", "sigwatch.lost.")
	stored := map[string]int{}
	for id := range ids {
		stored[id[:len(id)-6]]++
	}
	t.Logf("a before b: %d stored; a after b: %d refused, %d stored; b: %d stored; shard 4: %d stored",
		stored["a1"], refused, stored["a2"], stored["b"], stored["other"])
	if refused != 200 || stored["a2"] != 0 {
		t.Errorf("a after b fenced: %d refused, %d stored; want 200, 0", refused, stored["a2"])
	}
	if stored["a1"] != 50 || stored["b"] != 50 || stored["other"] != 50 {
		t.Errorf("stored a1 %d, b %d, other %d; want 50 each", stored["a1"], stored["b"], stored["other"])
	}

	// The fence messages are in the stream, on their own subjects.
	s, err := js.Stream(ctx, "SIGWATCH")
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetLastMsgForSubject(ctx, p.Subjects().Fence("deadlines", 3))
	if err != nil {
		t.Fatal(err)
	}
	if last.Sequence != b.Seq || string(last.Data) != `{"owner":"b","token":2}` {
		t.Errorf("last fence of shard 3: seq %d %s, want seq %d owner b", last.Sequence, last.Data, b.Seq)
	}
}

// TestCoreModeCannotFence shows that core NATS publishes unfenced.
func TestCoreModeCannotFence(t *testing.T) {
	ctx := context.Background()
	nc, _ := natsConn(t)
	p := newPublisher(t, nc, Options{Mode: Core})
	f, err := p.Fence(ctx, "deadlines", 0, "a", 1)
	if err != nil || f != (Fence{}) {
		t.Fatalf("core Fence = %+v, %v; want the zero Fence", f, err)
	}
	if err := p.PublishFenced(ctx, f, []Message{{Subject: "sigwatch.lost.x", ID: "x@1", Body: []byte(`{}`)}})[0]; err != nil {
		t.Fatal(err)
	}
}
