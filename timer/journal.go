package timer

import (
	"context"
	"errors"
	"fmt"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// The timers of a durable queue (timers.queues.<name>.durable, the
// default) are journalled in JetStream (dispatch.TimerJournal) once Redis
// has stored them and before they are acknowledged: a reset as the timer
// it left (the deadline that holds and the payload it has), a cancel as a
// tombstone. The guard restores them from there when Redis loses data.
//
// Two writes of one timer in flight at the same moment (in two batches or
// two processes) may reach the journal in the other order than Redis took
// them. So once its records are stored, a writer compares the timers in
// Redis with them and journals again, as Redis holds it, each that
// differs, until none does: whatever a writer journals later comes after
// that comparison, so the record the journal keeps last is what Redis
// holds.

// resetJournalled stores rs in Redis and journals the timers of durable
// queues as stored, all published at once and awaited together.
func (s *Service) resetJournalled(ctx context.Context, rs []shard.TimerReset) error {
	j := s.opts.Journal
	if j == nil {
		return s.writer.ResetTimers(ctx, rs)
	}
	at := make(map[string]int) // member -> index in states
	var states []dispatch.TimerState
	err := s.writer.ResetTimersStored(ctx, rs, func(_ shard.TimerReset, t shard.Timer) {
		q, id, _ := shard.SplitTimerMember(t.Member)
		if !s.opts.Durable(q) {
			return
		}
		st := dispatch.TimerState{Queue: q, ID: id, Deadline: t.Deadline, Payload: t.Payload}
		if k, ok := at[t.Member]; ok {
			states[k] = st
			return
		}
		at[t.Member] = len(states)
		states = append(states, st)
	})
	if err != nil {
		return err
	}
	return s.journal(ctx, states)
}

// cancelJournalled removes a timer from Redis and, for a durable queue,
// journals its tombstone, whether Redis held it or not: Redis may have
// lost what the journal still holds.
func (s *Service) cancelJournalled(ctx context.Context, queue, id string) (bool, error) {
	ok, err := s.writer.CancelTimer(ctx, shard.TimerMember(queue, id))
	if err != nil || s.opts.Journal == nil || !s.opts.Durable(queue) {
		return ok, err
	}
	return ok, s.journal(ctx, []dispatch.TimerState{{Queue: queue, ID: id}})
}

// journalRounds bounds how many times a write journals again timers that
// changed meanwhile: each round takes another write of one of them, by
// another writer, within a round trip to the journal and one to Redis.
const journalRounds = 64

// journal writes states and fails if any of them is not stored; then
// journals again, as Redis holds it, each timer Redis no longer holds as
// written (another write of it may have reached the journal first).
func (s *Service) journal(ctx context.Context, states []dispatch.TimerState) error {
	if s.beforeJournal != nil {
		s.beforeJournal(states)
	}
	for range journalRounds {
		if err := s.journalOnce(ctx, states); err != nil || len(states) == 0 {
			return err
		}
		want := make([]shard.Timer, len(states))
		for k, st := range states {
			want[k] = shard.Timer{Member: shard.TimerMember(st.Queue, st.ID), Deadline: st.Deadline, Payload: st.Payload}
		}
		changed, err := s.writer.TimersChanged(ctx, want)
		if err != nil {
			return fmt.Errorf("timer: compare the journal with Redis: %w", err)
		}
		states = states[:0:0]
		for _, t := range changed {
			q, id, _ := shard.SplitTimerMember(t.Member)
			states = append(states, dispatch.TimerState{Queue: q, ID: id, Deadline: t.Deadline, Payload: t.Payload})
		}
		s.m.journalRewrites.Add(float64(len(states)))
	}
	return fmt.Errorf("timer: %d timers changed by other writes while journalled, %d times over", len(states), journalRounds)
}

// journalOnce writes states and fails if any of them is not stored.
func (s *Service) journalOnce(ctx context.Context, states []dispatch.TimerState) error {
	if len(states) == 0 {
		return nil
	}
	errs := s.opts.Journal.Write(ctx, states, s.opts.Now())
	failed := 0
	for _, e := range errs {
		if e != nil {
			failed++
		}
	}
	s.m.journalled.Add(float64(len(states) - failed))
	if failed > 0 {
		s.m.journalErrors.Add(float64(failed))
		return fmt.Errorf("timer: %d of %d timers not journalled: %w", failed, len(states), errors.Join(errs...))
	}
	return nil
}
