package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The timer journal is the generic timers' durable memory outside Redis:
// the latest acknowledged state of each timer of a durable queue, in a
// stream that keeps one message per timer (MaxMsgsPerSubject 1). A timer's
// subject ends in a hash of its queue and id, never the id itself; the
// queue and id are in the body. A reset writes the timer's deadline and
// payload; a cancel writes a tombstone that expires a minute later, after
// which the timer is simply absent, as one that never was. A record
// expires the event stream's max age after its deadline, so the journal
// forgets a fired timer only once the stream can no longer say it fired.

// TimerState is one timer as the journal keeps it. Deadline 0 is a
// tombstone: the timer was cancelled. Stored is when Redis stored it (unix
// ms; Write sets it): a timer set to a deadline below one it already fired
// at is new only if it was stored after that fire.
type TimerState struct {
	Queue    string  `json:"q"`
	ID       string  `json:"id"`
	Deadline int64   `json:"d,omitempty"`
	Payload  RawJSON `json:"p,omitempty"`
	Stored   int64   `json:"s,omitempty"`
}

// TimerJournal is the journal of an installation's generic timers. It is
// safe for concurrent use.
type TimerJournal struct {
	bus     *Bus
	fast    bool // the stream takes fast batches (see fast.go)
	js      jetstream.JetStream
	room    *inflight // the publisher's: journal writes share its client
	stream  string
	subject string        // prefix of every timer's subject
	keep    time.Duration // how long a record outlives its deadline; 0: forever
	idle    time.Duration
}

// tombstoneTTL is how long a cancel's tombstone stays: long enough to
// replace the record it cancels, after which the timer is absent.
const tombstoneTTL = time.Minute

// TimerJournalStream is the name of the timer journal's stream.
func (p *Bus) TimerJournalStream() string { return p.opts.Stream + "_TIMER_JOURNAL" }

// OpenTimerJournal opens (creating if absent) the installation's timer
// journal. Storage and replicas follow nats.storage and nats.replicas.
// Fails in core mode.
func (p *Bus) OpenTimerJournal(ctx context.Context) (*TimerJournal, error) {
	if p.js == nil {
		return nil, ErrNoJetStream
	}
	storage, err := p.storage("timer journal")
	if err != nil {
		return nil, err
	}
	j := &TimerJournal{bus: p, js: p.js, room: p.room, stream: p.TimerJournalStream(),
		subject: "$SW." + p.opts.Stream + ".timer.", keep: p.opts.MaxAge, idle: p.opts.AckWait}
	want := jetstream.StreamConfig{
		Name:              j.stream,
		Description:       "sigwatch generic timers: the latest state of each",
		Subjects:          []string{j.subject + ">"},
		Storage:           storage,
		Replicas:          p.opts.Replicas,
		MaxMsgsPerSubject: 1,
		AllowMsgTTL:       true,
		AllowBatchPublish: true,
		Discard:           jetstream.DiscardOld,
	}
	s, err := p.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if s, err = p.js.CreateStream(ctx, want); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = p.js.Stream(ctx, want.Name)
		}
	}
	if err == nil {
		if has := s.CachedInfo().Config; has.Replicas != want.Replicas || !has.AllowBatchPublish {
			has.Replicas, has.AllowBatchPublish = want.Replicas, true
			s, err = p.js.UpdateStream(ctx, has)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: timer journal %s: %w", want.Name, err)
	}
	j.fast = takesFast(s.CachedInfo().Config) && p.fastIn != nil
	return j, nil
}

// key is the subject of the timer id of queue.
func (j *TimerJournal) key(queue, id string) string {
	sum := sha256.Sum256([]byte(queue + "/" + id))
	return j.subject + hex.EncodeToString(sum[:16])
}

// journalFast bounds the records of one fast batch, journalWindow the fast
// batches of one Write awaiting their answer at once.
const (
	journalFast   = 1000
	journalWindow = 8
)

// Write journals states, all published at once, and returns once each is
// stored or failed (errs[k] for states[k]). now is when they were
// acknowledged by Redis; a record expires keep after its deadline. On a
// single-server stream they go out as fast batches, several in flight
// (one answer per batch, see fast.go); what a batch did not store, and
// every record on a replicated stream, as asynchronous publishes.
func (j *TimerJournal) Write(ctx context.Context, states []TimerState, now time.Time) []error {
	errs := make([]error, len(states))
	msgs := make([]*nats.Msg, len(states))
	for k, st := range states {
		st.Stored = now.UnixMilli()
		b, err := json.Marshal(st)
		if err != nil {
			errs[k] = fmt.Errorf("dispatch: journal timer %s/%s: %w", st.Queue, st.ID, err)
			continue
		}
		m := nats.NewMsg(j.key(st.Queue, st.ID))
		m.Data = b
		if ttl := j.ttl(st, now); ttl > 0 {
			m.Header.Set(jetstream.MsgTTLHeader, ttl.String())
		}
		msgs[k] = m
	}
	rest := [][2]int{{0, len(states)}} // what goes out one by one
	if j.fast {
		rest = j.writeFast(ctx, msgs)
	}
	for _, r := range rest {
		for lo := r[0]; lo < r[1]; {
			hi := min(lo+j.room.max, r[1])
			if err := j.room.acquire(ctx, hi-lo); err != nil {
				for k := lo; k < hi; k++ {
					errs[k] = cmpErr(errs[k], fmt.Errorf("dispatch: journal timer: waiting for room among the publishes in flight: %w", err))
				}
				lo = hi
				continue
			}
			j.writePart(ctx, states[lo:hi], msgs[lo:hi], errs[lo:hi])
			lo = hi
		}
	}
	return errs
}

// journalBatch is a fast batch of msgs[lo:hi] awaiting its answer.
type journalBatch struct {
	lo, hi int
	id     string
	answer chan fastAnswer
}

// writeFast sends msgs as fast batches, journalWindow at a time, and
// returns the ranges of msgs the stream did not confirm stored.
func (j *TimerJournal) writeFast(ctx context.Context, msgs []*nats.Msg) (rest [][2]int) {
	p := j.bus
	var window []journalBatch
	await := func(b journalBatch) {
		defer p.fastIn.forget(b.id)
		n := 0
		wait, cancel := context.WithTimeout(ctx, p.opts.AckWait)
		defer cancel()
		select {
		case a := <-b.answer:
			if a.err == nil {
				n = min(a.count, b.hi-b.lo)
			}
		case <-wait.Done():
		}
		if b.lo+n < b.hi {
			rest = append(rest, [2]int{b.lo + n, b.hi})
		}
	}
	for lo := 0; lo < len(msgs); lo += journalFast {
		hi := min(lo+journalFast, len(msgs))
		if len(window) == journalWindow {
			await(window[0])
			window = window[1:]
		}
		b := journalBatch{lo: lo, hi: hi, id: p.batchIDs.next()}
		b.answer = p.fastIn.expect(b.id)
		if slices.Contains(msgs[lo:hi], nil) || j.sendFast(b.id, msgs[lo:hi]) != nil {
			p.fastIn.forget(b.id)
			rest = append(rest, [2]int{lo, hi})
			continue
		}
		window = append(window, b)
	}
	for _, b := range window {
		await(b)
	}
	return rest
}

// sendFast sends msgs as the fast batch id.
func (j *TimerJournal) sendFast(id string, msgs []*nats.Msg) error {
	fm := make([]*nats.Msg, len(msgs))
	for k, m := range msgs {
		// A copy: the message may go out again one by one.
		fm[k] = &nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header}
	}
	return j.bus.sendFast(id, fm)
}

// writePart publishes msgs (of states), which have their room, one by one
// and sets errs.
func (j *TimerJournal) writePart(ctx context.Context, states []TimerState, msgs []*nats.Msg, errs []error) {
	settled, pending := 0, []jetstream.PubAckFuture(nil)
	defer func() { j.room.release(settled, pending) }()
	futs := make([]jetstream.PubAckFuture, len(states))
	for k, st := range states {
		if msgs[k] == nil {
			continue
		}
		var err error
		if futs[k], err = j.js.PublishMsgAsync(msgs[k]); err != nil {
			errs[k] = fmt.Errorf("dispatch: journal timer %s/%s: %w", st.Queue, st.ID, err)
		}
	}
	for k, f := range futs {
		if f == nil {
			settled++
			continue
		}
		select {
		case <-f.Ok():
			settled++
		case err := <-f.Err():
			settled++
			errs[k] = fmt.Errorf("dispatch: journal timer %s/%s: %w", states[k].Queue, states[k].ID, err)
		case <-ctx.Done():
			pending = append(pending, f)
			errs[k] = fmt.Errorf("dispatch: journal timer %s/%s: %w", states[k].Queue, states[k].ID, ctx.Err())
		}
	}
}

// ttl is how long the record of st is kept (0: for ever): a tombstone a
// minute, a timer keep past its deadline, rounded up to a second.
func (j *TimerJournal) ttl(st TimerState, now time.Time) time.Duration {
	if st.Deadline == 0 {
		return tombstoneTTL
	}
	if j.keep <= 0 {
		return 0
	}
	d := time.UnixMilli(st.Deadline).Sub(now) + j.keep
	return max(time.Second, d.Truncate(time.Second)+time.Second)
}

// EventsFrom returns when the oldest event the event stream holds was
// stored (zero when it holds none).
func (p *Bus) EventsFrom(ctx context.Context) (time.Time, error) {
	if p.js == nil {
		return time.Time{}, ErrNoJetStream
	}
	s, err := p.js.Stream(ctx, p.opts.Stream)
	if err != nil {
		return time.Time{}, fmt.Errorf("dispatch: event stream: %w", err)
	}
	return s.CachedInfo().State.FirstTime, nil
}

// Each calls fn for every timer the journal holds (tombstones included),
// and stops at the first error fn returns. A timer written during the walk
// may be seen with either state, or not at all.
func (j *TimerJournal) Each(ctx context.Context, fn func(TimerState) error) error {
	setup, cancel := context.WithTimeout(ctx, walkSetup)
	defer cancel()
	cons, err := j.js.OrderedConsumer(setup, j.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{j.subject + ">"},
	})
	if err != nil {
		return fmt.Errorf("dispatch: timer journal walk: %w", err)
	}
	return drain(ctx, cons, "timer journal walk", j.idle, 0, func(m jetstream.Msg) error {
		var st TimerState
		if err := json.Unmarshal(m.Data(), &st); err != nil || st.Queue == "" {
			return nil // no timer anyone was told of
		}
		return fn(st)
	})
}

// TimersFired calls fn for every timer event the event stream holds that
// was stored at since or later: the fires a restore must not repeat.
func (p *Bus) TimersFired(ctx context.Context, since time.Time, fn func(Timer) error) error {
	if p.js == nil {
		return ErrNoJetStream
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{p.subjects.prefix() + ".timer.>"}}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := p.js.OrderedConsumer(ctx, p.opts.Stream, cfg)
	if err != nil {
		return fmt.Errorf("dispatch: read timer events: %w", err)
	}
	prefix := p.subjects.prefix() + ".timer."
	return drain(ctx, cons, "read timer events", p.opts.AckWait, 0, func(m jetstream.Msg) error {
		var t Timer
		if !strings.HasPrefix(m.Subject(), prefix) || json.Unmarshal(m.Data(), &t) != nil || t.Deadline == 0 {
			return nil
		}
		return fn(t)
	})
}
