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
// Two resets of one timer in flight at the same moment (in two batches or
// two processes) are journalled in either order: the journal may then keep
// the state of the one Redis stored first.

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

// journal writes states and fails if any of them is not stored.
func (s *Service) journal(ctx context.Context, states []dispatch.TimerState) error {
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
