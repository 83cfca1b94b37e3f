package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// UpdateFunc changes one device's record (see Registry.Update).
type UpdateFunc func(rec *DeviceRecord, exists bool) (keep, del bool)

// Add records devices first seen, waiting until each is stored: a device
// ingest acks a signal of is in the registry. A new key costs one
// asynchronous publish (expected last sequence 0), so a fleet coming
// online costs about what publishing its ids does; a device the registry
// already has (seen before, removed, or written by a restore) is merged
// with fn instead, by read-modify-write.
func (r *Registry) Add(ctx context.Context, recs []DeviceRecord, fn UpdateFunc) []error {
	errs := make([]error, len(recs))
	var again []int
	for lo := 0; lo < len(recs); lo += r.room.max {
		hi := min(lo+r.room.max, len(recs))
		if err := r.room.acquire(ctx, hi-lo); err != nil {
			for j := lo; j < len(recs); j++ {
				errs[j] = fmt.Errorf("dispatch: registry write of device %q: waiting for room among the publishes in flight: %w", recs[j].ID, err)
			}
			break
		}
		for _, j := range r.addPart(ctx, recs[lo:hi], errs[lo:hi]) {
			again = append(again, lo+j)
		}
	}
	if len(again) > 0 {
		ids := make([]string, len(again))
		for k, j := range again {
			ids[k] = recs[j].ID
		}
		for k, err := range r.Update(ctx, ids, fn) {
			errs[again[k]] = err
		}
	}
	return errs
}

// addPart publishes the new keys of recs, which have their room, and sets
// errs; it returns the indexes of the records that exist already.
func (r *Registry) addPart(ctx context.Context, recs []DeviceRecord, errs []error) (again []int) {
	settled, pending := 0, []jetstream.PubAckFuture(nil)
	defer func() { r.room.release(settled, pending) }()
	futs := make([]jetstream.PubAckFuture, len(recs))
	for j, rec := range recs {
		if !utf8.ValidString(rec.ID) {
			errs[j] = fmt.Errorf("dispatch: registry write of device %q: the id is not valid UTF-8", rec.ID)
			continue
		}
		b, err := json.Marshal(rec)
		if err != nil {
			errs[j] = err
			continue
		}
		m := nats.NewMsg("$KV." + r.bucket + "." + registryKey(rec.ID))
		m.Data = b
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		if futs[j], err = r.js.PublishMsgAsync(m); err != nil {
			errs[j] = fmt.Errorf("dispatch: registry write of device %q: %w", rec.ID, err)
		}
	}
	for j, f := range futs {
		if f == nil {
			settled++
			continue
		}
		select {
		case <-f.Ok():
			settled++
		case err := <-f.Err():
			settled++
			if isConflict(err) {
				again = append(again, j)
				continue
			}
			errs[j] = fmt.Errorf("dispatch: registry write of device %q: %w", recs[j].ID, err)
		case <-ctx.Done():
			pending = append(pending, f)
			errs[j] = fmt.Errorf("dispatch: registry write of device %q: %w", recs[j].ID, ctx.Err())
		}
	}
	return again
}

// laterQueue bounds the changes Later holds; a full queue makes Later wait.
const laterQueue = 1 << 18

// laterBatch is how many devices one background write covers at most.
const laterBatch = 4096

type later struct {
	id string
	fn UpdateFunc
}

// Later queues fn for id's record, to be written in the background by Run
// in batches, in the order queued. The writers of losses, recoveries and
// alarm states use it: their events are in the event stream already, so a
// restore reads the recent ones from there (Bus.Losses), and the
// registry need only catch up. It waits while the queue is full.
func (r *Registry) Later(ctx context.Context, id string, fn UpdateFunc) {
	select {
	case r.later <- later{id, fn}:
	case <-ctx.Done():
	}
}

// Run writes what Later queued until ctx is done, then what is left, for
// up to a few seconds.
func (r *Registry) Run(ctx context.Context) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	pending := map[string][]UpdateFunc{}
	var order []string
	flush := func(ctx context.Context) {
		if len(order) == 0 {
			return
		}
		fns := pending
		errs := r.Update(ctx, order, func(rec *DeviceRecord, exists bool) (bool, bool) {
			keep, del := false, false
			for _, fn := range fns[rec.ID] {
				k, d := fn(rec, exists && !del)
				keep = keep || k
				del = k && d
			}
			return keep, del
		})
		for j, err := range errs {
			if err != nil && r.log != nil {
				r.log.Warn("registry not updated; the event stream still has the change", "device", order[j], "err", err)
			}
		}
		pending, order = map[string][]UpdateFunc{}, nil
	}
	add := func(l later) {
		if _, ok := pending[l.id]; !ok {
			order = append(order, l.id)
		}
		pending[l.id] = append(pending[l.id], l.fn)
	}
	for {
		select {
		case l := <-r.later:
			if add(l); len(order) >= laterBatch {
				flush(ctx)
			}
		case <-t.C:
			flush(ctx)
		case <-ctx.Done():
			for {
				select {
				case l := <-r.later:
					add(l)
					continue
				default:
				}
				break
			}
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			flush(fctx)
			cancel()
			return nil
		}
	}
}

// Losses calls fn, in stream order, for every lost and recovered event
// the event stream still holds (exactly one of lost and rec is set): the
// recent history of losses, which a restore lays over the registry's
// records.
func (p *Bus) Losses(ctx context.Context, fn func(lost *Lost, rec *Recovered) error) error {
	if p.js == nil {
		return errors.New("dispatch: no event stream in core mode")
	}
	s, err := p.js.Stream(ctx, p.opts.Stream)
	if err != nil {
		return fmt.Errorf("dispatch: read losses: %w", err)
	}
	lostFilter, recFilter := p.subjects.AllLost(), p.subjects.prefix()+".recovered.>"
	lostPrefix := strings.TrimSuffix(lostFilter, ">")
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{lostFilter, recFilter}})
	if err != nil {
		return fmt.Errorf("dispatch: read losses: %w", err)
	}
	return drain(ctx, cons, "read losses", p.opts.AckWait, 0, func(m jetstream.Msg) error {
		// A body that does not parse is no loss anyone was told of.
		if strings.HasPrefix(m.Subject(), lostPrefix) {
			var lost Lost
			if json.Unmarshal(m.Data(), &lost) == nil && lost.Deadline != 0 {
				return fn(&lost, nil)
			}
			return nil
		}
		var rec Recovered
		if json.Unmarshal(m.Data(), &rec) == nil && rec.LostAt != 0 {
			return fn(nil, &rec)
		}
		return nil
	})
}

// Drop deletes the registry's bucket and everything in it.
func (r *Registry) Drop(ctx context.Context) error {
	if err := r.js.DeleteKeyValue(ctx, r.bucket); err != nil {
		return fmt.Errorf("dispatch: drop registry bucket %s: %w", r.bucket, err)
	}
	return nil
}
