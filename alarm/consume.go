package alarm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/dispatch"
)

// consumer creates (or updates) the durable pull consumer every replica
// shares. A new consumer starts with the events published from then on:
// devices already lost before the alarm role first ran get no alarm.
func (a *Alarms) consumer(ctx context.Context) (jetstream.Consumer, error) {
	js, err := jetstream.New(a.pub.Conn())
	if err != nil {
		return nil, fmt.Errorf("alarm: jetstream: %w", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, a.opts.Stream, jetstream.ConsumerConfig{
		Durable:        a.opts.Consumer,
		Description:    "sigwatch alarm workers",
		FilterSubjects: []string{a.lostPrefix() + ">", a.recoveredPrefix() + ">"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        a.opts.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  max(1024, 4*a.opts.Workers),
	})
	if err != nil {
		return nil, fmt.Errorf("alarm: consumer %s on stream %s: %w", a.opts.Consumer, a.opts.Stream, err)
	}
	return cons, nil
}

// lostPrefix and recoveredPrefix start the subjects of lost and recovered
// events; a type token follows.
func (a *Alarms) lostPrefix() string {
	return cmp.Or(a.pub.Subjects.Prefix, dispatch.DefaultPrefix) + ".lost."
}

func (a *Alarms) recoveredPrefix() string {
	return cmp.Or(a.pub.Subjects.Prefix, dispatch.DefaultPrefix) + ".recovered."
}

// shutdownGrace bounds how long the handlers of events in hand may take
// once Run is stopping; what is not acked by then is redelivered.
const shutdownGrace = 5 * time.Second

// consume handles events until ctx is done, at most Workers at once. On
// shutdown it stops pulling, handles what it holds, and returns. A consumer
// deleted under it is created again.
func (a *Alarms) consume(ctx context.Context, cons jetstream.Consumer) error {
	// Handlers finish on workCtx, which outlives ctx by the grace.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	sem := make(chan struct{}, a.opts.Workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		gone, err := a.pull(ctx, cons, cancelWork, func(msg jetstream.Msg) {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				a.handle(workCtx, msg)
			})
		})
		if err != nil || !gone {
			return err
		}
		a.log.Warn("alarm consumer deleted under the workers; creating it again", "consumer", a.opts.Consumer)
		for {
			if cons, err = a.consumer(ctx); err == nil {
				break
			}
			if !sleep(ctx, time.Second) {
				return nil
			}
		}
	}
}

// pull passes each event of cons to handle until ctx is done (gone false)
// or the consumer is deleted (gone true). Once ctx is done it hands over
// what it already pulled, for up to shutdownGrace; then it calls
// cancelWork.
func (a *Alarms) pull(ctx context.Context, cons jetstream.Consumer, cancelWork func(), handle func(jetstream.Msg)) (gone bool, err error) {
	it, err := cons.Messages(jetstream.PullMaxMessages(a.opts.Workers))
	if err != nil {
		return false, fmt.Errorf("alarm: consume: %w", err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() { // Stops the iterator; ends with pull.
		select {
		case <-ctx.Done():
			it.Drain()
			t := time.NewTimer(shutdownGrace)
			defer t.Stop()
			select {
			case <-t.C:
				it.Stop()
				cancelWork()
			case <-done:
			}
		case <-done:
			it.Stop()
		}
	}()
	failures := 0
	for {
		msg, err := it.Next()
		switch {
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return false, nil
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return true, nil
		case err != nil:
			// Heartbeats missed (NATS unreachable): the iterator reconnects.
			failures++
			if failures == 1 || failures%20 == 0 {
				a.log.Warn("alarm events: pull failed; retrying", "err", err, "failures", failures)
			}
			// Once ctx is done the iterator closes; until then, pause.
			sleep(ctx, min(time.Duration(failures)*100*time.Millisecond, 2*time.Second))
			continue
		}
		failures = 0
		handle(msg)
	}
}

// sleep waits d and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// handle applies one event and acknowledges it once what it decided is
// stored and published; otherwise it is delivered again after a pause.
func (a *Alarms) handle(ctx context.Context, msg jetstream.Msg) {
	var err error
	subj := msg.Subject()
	switch {
	case strings.HasPrefix(subj, a.lostPrefix()):
		var ev dispatch.Lost
		if err = json.Unmarshal(msg.Data(), &ev); err == nil && ev.Device != "" {
			err = a.onLost(ctx, ev)
		} else {
			a.refuse(msg, err)
			return
		}
	case strings.HasPrefix(subj, a.recoveredPrefix()):
		var ev dispatch.Recovered
		if err = json.Unmarshal(msg.Data(), &ev); err == nil && ev.Device != "" {
			err = a.onRecovered(ctx, ev)
		} else {
			a.refuse(msg, err)
			return
		}
	}
	if err != nil {
		delay := time.Second
		if md, mdErr := msg.Metadata(); mdErr == nil {
			delay = min(time.Duration(md.NumDelivered)*time.Second, 30*time.Second)
		}
		a.log.Warn("alarm event not handled; redelivered later", "subject", subj, "err", err, "in", delay)
		_ = msg.NakWithDelay(delay)
		return
	}
	// A lost ack is harmless: the event comes again and changes nothing.
	_ = msg.Ack()
}

// refuse drops an event that cannot be read: redelivering it cannot help.
func (a *Alarms) refuse(msg jetstream.Msg, err error) {
	a.log.Error("alarm event unreadable; dropped", "subject", msg.Subject(), "err", err, "body", string(msg.Data()))
	_ = msg.Term()
}

// onLost raises an alarm for a lost device, unless it has signalled again
// since (or damps it into flapping).
func (a *Alarms) onLost(ctx context.Context, ev dispatch.Lost) error {
	cur, err := a.current(ctx, ev.Device)
	if err != nil {
		return err
	}
	now := a.opts.Now()
	m := a.machine(ev.Device, now)
	var changed bool
	_, err = a.apply(ctx, ev.Device, now, func(st *State) (bool, error) {
		changed = m.lost(st, ev.Deadline, ev.Type, cur)
		return changed, nil
	})
	if err == nil {
		a.m.handled("lost", changed)
	}
	return err
}

// onRecovered resolves the alarm of a device that signalled again.
func (a *Alarms) onRecovered(ctx context.Context, ev dispatch.Recovered) error {
	now := a.opts.Now()
	m := a.machine(ev.Device, now)
	var changed bool
	_, err := a.apply(ctx, ev.Device, now, func(st *State) (bool, error) {
		changed = m.recovered(st, ev.LostAt, ev.Type)
		return changed, nil
	})
	if err == nil {
		a.m.handled("recovered", changed)
	}
	return err
}
