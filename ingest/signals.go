package ingest

import (
	"context"
	"fmt"
	"github.com/sigwatch/sigwatch/shard"
	"time"
)

// Sig is one signal handed to Signals by a caller that is not on MQTT.
type Sig struct {
	ID, Type string
	// Group is the device's group; "" keeps the one it has.
	Group string
	// At is the signal's own time, clamped into [now-MaxSkew, now] as it
	// enters the pipeline. Zero means the moment it enters the pipeline.
	At time.Time
	// Declared is the deadline the device declares itself, if any.
	Declared Declared
}

// SignalError is the refusal of one entry of a Signals call; nothing of
// that call was stored.
type SignalError struct {
	Index int // the entry's position in the call
	ID    string
	Err   error
}

func (e *SignalError) Error() string {
	return fmt.Sprintf("ingest: signal %d (%q): %v", e.Index, e.ID, e.Err)
}

func (e *SignalError) Unwrap() error { return e.Err }

// Signals pushes the deadlines of sigs forward through the same pipeline as
// MQTT messages, as one batch, and returns once every one is stored: the
// pipeline groups them per shard and flushes the shards in parallel.
//
// Every entry is checked first; a bad one fails the call with a
// *SignalError and nothing is stored. Each entry is stamped as it enters the
// pipeline, in order with the probe barriers (see enqueueStamped), so no
// watermark vouches for an entry before it is stored. Signals never
// advances the watermark. It waits for Run to start, and fails with
// ErrStopped once Run is stopping; entries handed over before that are
// still stored (ZADD GT makes sending them again harmless).
func (in *Ingest) Signals(ctx context.Context, sigs []Sig) error {
	for j, s := range sigs {
		err := shard.CheckID(s.ID, in.opts.MaxIDLen)
		if err == nil {
			err = shard.CheckType(s.Type, in.opts.MaxIDLen)
		}
		if err == nil {
			err = shard.CheckGroup(s.Group, in.opts.MaxIDLen)
		}
		if err != nil {
			in.m.invalid[reasonOf(err)].Inc()
			return &SignalError{Index: j, ID: s.ID, Err: err}
		}
	}
	select {
	case <-in.started:
	case <-ctx.Done():
		return fmt.Errorf("ingest: signals: %w", ctx.Err())
	}
	// One result per entry handed over; the buffer lets the flushers report
	// without waiting for this caller, who may have given up.
	done := make(chan error, len(sigs))
	var err error
	sent := 0
	for _, s := range sigs {
		if err = in.pipe.enqueueStamped(ctx, s, done); err != nil {
			break
		}
		sent++
	}
	for range sent {
		select {
		case e := <-done:
			if err == nil {
				err = e
			}
		case <-ctx.Done():
			// What was handed over is still stored; the caller just does
			// not wait.
			return fmt.Errorf("ingest: signals: %w", ctx.Err())
		}
	}
	if err != nil {
		return fmt.Errorf("ingest: signals: %d of %d handed over before: %w", sent, len(sigs), err)
	}
	return nil
}

// enqueueStamped hands one API signal to the collector once it has an
// in-flight slot, stamping it at that moment: under order, which barriers
// are enqueued under too. A barrier of a probe sent at T is therefore
// either behind the signal in work (it waits for the signal's flush) or
// was enqueued before the signal was stamped (so the stamp is T or later,
// and a watermark of T says nothing about it). An own time at is clamped
// against that moment. Like enqueue, it hands nothing over when the
// pipeline is stopping or ctx ends first.
func (p *pipeline) enqueueStamped(ctx context.Context, s Sig, done chan error) error {
	return p.hand(ctx, func() signal {
		now := p.opts.Now()
		at := s.At
		if at.IsZero() {
			at = now
		}
		sig := p.signal(s.ID, s.Type, s.Group, clamp(at, now, p.opts.MaxSkew), nil, done)
		if p.declare(&sig, s.Declared) {
			p.m.clamped.Inc()
		}
		return sig
	}, true)
}
