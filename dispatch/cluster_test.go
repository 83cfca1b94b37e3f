package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// dialCluster opens a publisher on the nodes of c at urls, with the stream at three replicas,
// as sigwatch does.
func dialCluster(t *testing.T, urls []string, ackWait time.Duration) *Bus {
	t.Helper()
	cfg := DefaultConfig()
	cfg.URL, cfg.Replicas, cfg.AckWait = strings.Join(urls, ","), 3, ackWait
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := Dial(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func lostBatch(p *Bus, from string, n int) []Message {
	msgs := make([]Message, n)
	for j := range msgs {
		msgs[j] = Message{Subject: p.Subjects().Lost("meter"), ID: fmt.Sprintf("%s-%04d@1", from, j), Body: []byte(`{}`)}
	}
	return msgs
}

// TestFencedBatchOnReplicatedStream publishes a shard's batch under its owner's fence into a
// stream of three replicas. A replicated stream checks one expected-last-subject-sequence at a
// time per subject and refuses the others in flight with "wrong last sequence" (10164) rather
// than wait: the batch goes out as one atomic batch, its fence checked once, and the sole owner
// of the shard has its whole batch stored, not told it was fenced out.
func TestFencedBatchOnReplicatedStream(t *testing.T) {
	c := testenv.NATSCluster(t)
	p := dialCluster(t, c.URLs(), 5*time.Second)
	ctx := context.Background()
	f, err := p.Fence(ctx, "deadlines", 3, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	const n = 256
	var fenced, failed int
	start := time.Now()
	errs := p.PublishFenced(ctx, f, lostBatch(p, "a", n))
	t.Logf("a fenced batch of %d took %v", n, time.Since(start).Round(time.Millisecond))
	for j, err := range errs {
		switch {
		case errors.Is(err, ErrFenced):
			fenced++
		case err != nil:
			failed++
			t.Logf("message %d: %v", j, err)
		}
	}
	if fenced != 0 || failed != 0 {
		t.Errorf("sole owner's batch of %d: got %d refused as fenced and %d failed, want 0 and 0", n, fenced, failed)
	}
	if got := storedIDs(t, c, p.Subjects().AllLost()); len(got) != n {
		t.Errorf("stream holds %d lost events, want %d", len(got), n)
	}
	if got := testutil.ToFloat64(p.atomicBatches); got != 1 || testutil.ToFloat64(p.atomicFallbacks) != 0 {
		t.Errorf("atomic batches %v, fallbacks %v: want the batch stored as one atomic batch", got, testutil.ToFloat64(p.atomicFallbacks))
	}

	// A real fence still refuses the earlier owner.
	if _, err := p.Fence(ctx, "deadlines", 3, "b", 2); err != nil {
		t.Fatal(err)
	}
	for j, err := range p.PublishFenced(ctx, f, lostBatch(p, "stale", 20)) {
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("earlier owner after b fenced, message %d: got %v, want ErrFenced", j, err)
		}
	}
}

// TestPublishAcrossLeaderKill publishes fenced batches without pause while the stream's leader
// is killed with -9 and a new one is elected. A message reported published is stored; every
// message reported failed is published again, as the scanner does, until it is stored; nothing
// is stored twice; and no publish is left waiting for an acknowledgement that will never come.
func TestPublishAcrossLeaderKill(t *testing.T) {
	c := testenv.NATSCluster(t)
	const ackWait = 2 * time.Second
	dialCluster(t, c.URLs(), ackWait) // creates the stream
	var (
		leader int
		err    error
	)
	testenv.WaitFor(t, 10*time.Second, "a stream leader", func() bool {
		leader, err = c.StreamLeader("SIGWATCH")
		return err == nil && leader >= 0
	})
	// The publisher is on a follower: the leader's death does not disconnect it, so nothing
	// but the publisher itself gives up on the acknowledgements the leader took with it.
	var followers []string
	for i, u := range c.URLs() {
		if i != leader {
			followers = append(followers, u)
		}
	}
	p := dialCluster(t, followers, ackWait)
	ctx := context.Background()
	f, err := p.Fence(ctx, "deadlines", 1, "a", 1)
	if err != nil {
		t.Fatal(err)
	}

	ok := map[string]bool{}
	var todo []Message
	failures, round := 0, 0
	publish := func() {
		if len(todo) == 0 {
			todo = lostBatch(p, fmt.Sprint("r", round), 64)
			round++
		}
		var again []Message
		for j, err := range p.PublishFenced(ctx, f, todo) {
			if errors.Is(err, ErrFenced) {
				t.Fatalf("sole owner fenced out: %v", err)
			}
			if err != nil {
				failures++
				again = append(again, todo[j])
				continue
			}
			ok[todo[j].ID] = true
		}
		todo = again
	}
	for range 5 {
		publish()
	}
	killed := time.Now()
	// The kill lands while batches are in flight.
	go func() {
		time.Sleep(5 * time.Millisecond)
		c.Kill(leader)
	}()
	for time.Since(killed) < 20*time.Second {
		publish()
		if l, err := c.StreamLeader(p.opts.Stream); err == nil && l >= 0 && l != leader && len(todo) == 0 && time.Since(killed) > time.Second {
			break
		}
	}
	if len(todo) != 0 {
		t.Fatalf("%d messages still not published 20s after the leader was killed", len(todo))
	}
	t.Logf("%d publishes failed during the failover and were published again; new leader after %v",
		failures, time.Since(killed).Round(time.Millisecond))

	stored := storedIDs(t, c, p.Subjects().AllLost())
	for id, n := range stored {
		if n != 1 {
			t.Errorf("event %s stored %d times, want once", id, n)
		}
	}
	for id := range ok {
		if stored[id] == 0 {
			t.Errorf("event %s reported published but not in the stream", id)
		}
	}
	if len(stored) != len(ok) {
		t.Errorf("stream holds %d events, %d were reported published", len(stored), len(ok))
	}
	// A publish whose acknowledgement died with the leader must not hold a slot of
	// nats.max_pending for ever: enough of them would stall every later publish.
	deadline := time.Now().Add(2 * ackWait)
	for p.js.PublishAsyncPending() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := p.js.PublishAsyncPending(); n > 0 {
		t.Errorf("%d publishes still wait for an acknowledgement %v after the last publish returned, want 0", n, 2*ackWait)
	}
}

// storedIDs counts the messages of the SIGWATCH stream on filter under each Nats-Msg-Id, read
// from a live node. Right after a node was killed the cluster may take a while to serve a new
// consumer, so a read that fails is tried again, for up to a minute.
func storedIDs(t *testing.T, c *servers.NATSCluster, filter string) map[string]int {
	t.Helper()
	nc, err := nats.Connect(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		ids, err := readIDs(js, filter)
		if err == nil {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("reading the stream: %v", err)
		}
		t.Logf("reading the stream: %v; trying again", err)
		time.Sleep(time.Second)
	}
}

// readIDs is one attempt of storedIDs.
func readIDs(js jetstream.JetStream, filter string) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "SIGWATCH")
	if err != nil {
		return nil, fmt.Errorf("stream info: %w", err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, HeadersOnly: true})
	if err != nil {
		return nil, fmt.Errorf("ordered consumer: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer info: %w", err)
	}
	ids := map[string]int{}
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			ids[m.Headers().Get(nats.MsgIdHdr)]++
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("read stalled with %d messages left: %v", left, batch.Error())
		}
		left -= uint64(n)
	}
	return ids, nil
}
