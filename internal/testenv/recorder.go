package testenv

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Event is one message a Recorder received, its JSON body decoded into a T.
type Event[T any] struct {
	Subject string
	MsgID   string // the Nats-Msg-Id header, which JetStream de-duplicates on
	Header  nats.Header
	Body    T
	At      time.Time // when the recorder received it
}

// Recorder keeps every message received on a subject filter, in arrival order, with its body
// decoded from JSON into a T. A body that does not decode fails the test. It is safe for
// concurrent use; the test reads it while messages arrive.
type Recorder[T any] struct {
	t      testing.TB
	mu     sync.Mutex
	events []Event[T]
	checks []func(Event[T]) error
	done   bool // set when the test ends: the recorder no longer reports to t
}

// Record subscribes nc to subject on core NATS and records what arrives from now on, until the
// test ends. The subscription is known to the server when Record returns.
func Record[T any](t testing.TB, nc *nats.Conn, subject string) *Recorder[T] {
	t.Helper()
	r := &Recorder[T]{t: t}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { r.add(m.Subject, m.Header, m.Data) })
	if err != nil {
		t.Fatalf("testenv: subscribe %s: %v", subject, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("testenv: subscribe %s: %v", subject, err)
	}
	t.Cleanup(func() {
		r.stop()
		_ = sub.Unsubscribe()
	})
	return r
}

// RecordStream records the messages of the JetStream stream whose subjects match the filters,
// from the stream's first message on and then as they are stored, until the test ends. It waits
// up to 20s for the stream to exist, since the process under test may create it.
func RecordStream[T any](t testing.TB, nc *nats.Conn, stream string, filters ...string) *Recorder[T] {
	t.Helper()
	s := waitStream(t, nc, stream)
	ctx := context.Background()
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		t.Fatalf("testenv: consumer of %s %v: %v", stream, filters, err)
	}
	r := &Recorder[T]{t: t}
	cc, err := cons.Consume(func(m jetstream.Msg) { r.add(m.Subject(), m.Headers(), m.Data()) })
	if err != nil {
		t.Fatalf("testenv: consume %s %v: %v", stream, filters, err)
	}
	t.Cleanup(func() {
		r.stop()
		cc.Stop()
	})
	return r
}

func waitStream(t testing.TB, nc *nats.Conn, name string) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testenv: jetstream: %v", err)
	}
	var s jetstream.Stream
	WaitFor(t, 20*time.Second, "stream "+name, func() bool {
		s, err = js.Stream(context.Background(), name)
		return err == nil
	})
	return s
}

func (r *Recorder[T]) add(subject string, h nats.Header, data []byte) {
	e := Event[T]{Subject: subject, MsgID: h.Get(nats.MsgIdHdr), Header: h, At: time.Now()}
	err := json.Unmarshal(data, &e.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	if err != nil {
		r.t.Errorf("testenv: body of %s %q: %v", subject, data, err)
		return
	}
	r.events = append(r.events, e)
	for _, check := range r.checks {
		if err := check(e); err != nil {
			r.t.Errorf("%s %s: %v", subject, e.MsgID, err)
		}
	}
}

func (r *Recorder[T]) stop() {
	r.mu.Lock()
	r.done = true
	r.mu.Unlock()
}

// Require fails the test for every event, received already or to come, for which check
// returns an error.
func (r *Recorder[T]) Require(check func(Event[T]) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if err := check(e); err != nil {
			r.t.Errorf("%s %s: %v", e.Subject, e.MsgID, err)
		}
	}
	r.checks = append(r.checks, check)
}

// Events returns every event received so far, in arrival order.
func (r *Recorder[T]) Events() []Event[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Len returns how many events were received so far.
func (r *Recorder[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// Where returns the events whose bodies match, in arrival order. A nil match matches all.
func (r *Recorder[T]) Where(match func(T) bool) []Event[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event[T]
	for _, e := range r.events {
		if match == nil || match(e.Body) {
			out = append(out, e)
		}
	}
	return out
}

// Bodies returns the bodies that match, in arrival order. A nil match matches all.
func (r *Recorder[T]) Bodies(match func(T) bool) []T {
	var out []T
	for _, e := range r.Where(match) {
		out = append(out, e.Body)
	}
	return out
}

// ByMsgID returns the first event that carried Nats-Msg-Id id.
func (r *Recorder[T]) ByMsgID(id string) (Event[T], bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.MsgID == id {
			return e, true
		}
	}
	return Event[T]{}, false
}

// MsgIDs counts the events received under each Nats-Msg-Id.
func (r *Recorder[T]) MsgIDs() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make(map[string]int, len(r.events))
	for _, e := range r.events {
		ids[e.MsgID]++
	}
	return ids
}

// Wait waits up to timeout for an event whose body matches, and returns the first. what
// completes "timed out waiting for ...".
func (r *Recorder[T]) Wait(t testing.TB, timeout time.Duration, what string, match func(T) bool) Event[T] {
	t.Helper()
	return r.WaitN(t, timeout, 1, what, match)[0]
}

// WaitN waits up to timeout until at least n events match (a nil match matches all), and
// returns those that do.
func (r *Recorder[T]) WaitN(t testing.TB, timeout time.Duration, n int, what string, match func(T) bool) []Event[T] {
	t.Helper()
	var got []Event[T]
	WaitFor(t, timeout, what, func() bool {
		got = r.Where(match)
		return len(got) >= n
	})
	return got
}

// StreamMsgIDs counts the messages stored in the JetStream stream under each Nats-Msg-Id, for
// the subjects that start with prefix. JetStream drops a re-publish of a known id within its
// window, so this is what sigwatch promises downstream: one stored message per event.
func StreamMsgIDs(t testing.TB, nc *nats.Conn, stream, prefix string) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, m := range StreamMessages(t, nc, stream, prefix) {
		ids[m.Header.Get(nats.MsgIdHdr)]++
	}
	return ids
}
