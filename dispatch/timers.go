package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Timer says a generic timer fired. ID is "<queue>/<timer>@<deadline>", its
// Nats-Msg-Id; Payload is the timer's last payload (null when none).
type Timer struct {
	ID       string  `json:"id"`
	Queue    string  `json:"queue"`
	Timer    string  `json:"timer"`
	Deadline int64   `json:"deadline"`
	FiredAt  int64   `json:"fired_at"`
	Payload  RawJSON `json:"payload"`
}

// RawJSON is a JSON value carried as is; empty encodes as null.
type RawJSON []byte

// MarshalJSON returns r, or null when r is empty.
func (r RawJSON) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	return r, nil
}

// UnmarshalJSON keeps a copy of b; null becomes empty.
func (r *RawJSON) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*r = nil
		return nil
	}
	*r = append((*r)[:0], b...)
	return nil
}

// TimerID is the de-duplication id of the fire of a timer at deadline.
func TimerID(queue, timer string, deadline int64) string {
	return queue + "/" + timer + "@" + strconv.FormatInt(deadline, 10)
}

// Timer is the subject of the fired timers of a queue. A queue name is one
// subject token ([A-Za-z0-9_-]); a timer id never enters a subject.
func (s Subjects) Timer(queue string) string { return s.prefix() + ".timer." + queue }

// TimerSet is the subject timer resets of a queue are published on.
func (s Subjects) TimerSet(queue string) string { return s.prefix() + ".timers.set." + queue }

// AllTimerSet is the wildcard of every queue's reset subject.
func (s Subjects) AllTimerSet() string { return s.prefix() + ".timers.set.>" }

// TimerStream is the name of the work-queue stream of timer resets.
func (p *Bus) TimerStream() string { return p.opts.Stream + "_TIMERS" }

// timerConsumer is the durable consumer every sigwatch process pulls the
// timer resets from.
const timerConsumer = "sigwatch-timers"

// ErrNoTimerStream is returned by TimerBacklog before any process created
// the reset stream: no reset can be waiting.
var ErrNoTimerStream = errors.New("dispatch: no timer reset stream yet")

// ErrNoJetStream is returned by what needs JetStream in core NATS mode.
var ErrNoJetStream = errors.New("dispatch: needs JetStream (nats.mode: jetstream)")

// TimerResets returns the durable consumer of the timer resets, creating
// the work-queue stream and the consumer if they are absent. A reset
// stays in the stream until a sigwatch process acknowledges it, which it
// does once the reset is stored in Redis; so the stream holds exactly the
// resets not yet stored, and its oldest one bounds how far timers may fire
// (TimerBacklog).
func (p *Bus) TimerResets(ctx context.Context, ackWait time.Duration, maxAckPending int) (jetstream.Consumer, error) {
	if p.js == nil {
		return nil, ErrNoJetStream
	}
	storage := jetstream.FileStorage
	if p.opts.Storage == "memory" {
		storage = jetstream.MemoryStorage
	}
	want := jetstream.StreamConfig{
		Name:        p.TimerStream(),
		Description: "sigwatch timer resets not yet stored",
		Subjects:    []string{p.subjects.AllTimerSet()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     storage,
		Replicas:    p.opts.Replicas,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    -1,
		MaxMsgs:     -1,
	}
	s, err := p.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Created, not created-or-updated: a replica that finds it made
		// meanwhile by another must not update it (below, it does only if
		// it differs).
		if s, err = p.js.CreateStream(ctx, want); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = p.js.Stream(ctx, want.Name)
		}
	}
	if err == nil && !sameTimerStream(s.CachedInfo().Config, want) {
		// Updated only when it differs: every replica starts here, and
		// nats-server's stream update races with another replica's
		// consumer creation on the same stream (seen under -race).
		s, err = p.js.UpdateStream(ctx, want)
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: timer reset stream %s: %w", p.TimerStream(), err)
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       timerConsumer,
		Description:   "sigwatch stores timer resets",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: maxAckPending,
		MaxWaiting:    512,
	})
	if err != nil {
		return nil, fmt.Errorf("dispatch: timer reset consumer: %w", err)
	}
	return c, nil
}

// TimerBacklog reports how many timer resets wait in the stream, not yet
// stored, and when the oldest of them was published (server time).
func (p *Bus) TimerBacklog(ctx context.Context) (n uint64, oldest time.Time, err error) {
	if p.js == nil {
		return 0, time.Time{}, ErrNoJetStream
	}
	s, err := p.js.Stream(ctx, p.TimerStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, time.Time{}, ErrNoTimerStream
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("dispatch: timer reset stream: %w", err)
	}
	st := s.CachedInfo().State
	return st.Msgs, st.FirstTime, nil
}

// sameTimerStream reports whether the timer reset stream has the
// configuration TimerResets asks for.
func sameTimerStream(has, want jetstream.StreamConfig) bool {
	return slices.Equal(has.Subjects, want.Subjects) && has.Retention == want.Retention &&
		has.Storage == want.Storage && has.Replicas == want.Replicas && has.Discard == want.Discard &&
		has.MaxBytes == want.MaxBytes && has.MaxMsgs == want.MaxMsgs && has.Description == want.Description
}

// TimerReset is the subject of the requests that store timer resets of a
// queue and are answered once they are stored (see ServeTimerResets).
func (s Subjects) TimerReset(queue string) string { return s.prefix() + ".timers.reset." + queue }

// AllTimerReset is the wildcard of every queue's reset request subject.
func (s Subjects) AllTimerReset() string { return s.prefix() + ".timers.reset.>" }

// Request is one core NATS request, answered with Respond.
type Request struct {
	Subject string
	Data    []byte
	msg     *nats.Msg
}

// Respond answers the request.
func (r Request) Respond(body []byte) error { return r.msg.Respond(body) }

// timerRequestGroup is the queue group of the reset requests: each request
// goes to one process.
const timerRequestGroup = "sigwatch-timers"

// ServeTimerResets hands the reset requests of every queue to handle in
// batches (b), each request to one process of those serving, until ctx is
// done. A request waits while the workers are busy; the requester's
// timeout bounds that.
func (p *Bus) ServeTimerResets(ctx context.Context, b Batching, handle func(context.Context, []Request)) error {
	in := make(chan Request, 4*b.Size)
	var wg sync.WaitGroup
	defer wg.Wait()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for range max(1, b.Workers) {
		wg.Go(func() { batches(wctx, in, b.Size, handle) })
	}
	sub, err := p.nc.QueueSubscribe(p.subjects.AllTimerReset(), timerRequestGroup, func(m *nats.Msg) {
		select {
		case in <- Request{Subject: m.Subject, Data: m.Data, msg: m}:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return fmt.Errorf("dispatch: serve timer reset requests: %w", err)
	}
	<-ctx.Done()
	return sub.Unsubscribe()
}
