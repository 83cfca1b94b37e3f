package scanner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/backoff"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
)

// family is the deadline family's name in the metrics' family label.
const family = "deadlines"

// lost is the deadline family's queue.Handler: a due deadline is a lost
// device.
type lost struct {
	store   *shard.Store
	pub     *dispatch.Bus
	thr     *shard.Thresholds
	m       *metrics
	log     *slog.Logger
	replica string

	// beforePublish, a test seam, runs after a batch is claimed and marked
	// and before its events are published.
	beforePublish func(i int)
}

var (
	_ queue.Handler = (*lost)(nil)
	_ queue.Fencer  = (*lost)(nil)
)

// Fence fences the lost events of a shard whose lease replica owner has
// just taken (see dispatch.Fence).
func (h *lost) Fence(ctx context.Context, l shard.Lease) (uint64, error) {
	f, err := h.pub.Fence(ctx, family, l.Shard, h.replica, l.Token())
	return f.Seq, err
}

// Fire marks the devices of b.Due lost and publishes their lost events
// under the shard's fence, deferring the entries the outage rule protects.
// It returns the entries to remove (marked and published) and the
// deferrals. An error says some entries were neither; they stay and are
// retried. A publish the stream refuses because another replica fenced the
// shard fails the batch with queue.ErrFenced.
func (h *lost) Fire(ctx context.Context, b queue.Batch) (handled []shard.Entry, moves []shard.Move, err error) {
	i, due := b.Shard, b.Due
	ids := make([]string, len(due))
	deadlines := make([]int64, len(due))
	for j, e := range due {
		ids[j], deadlines[j] = e.ID, e.Deadline
	}
	devs, decls, err := h.store.DevicesDeclared(ctx, ids, deadlines)
	if err != nil {
		return nil, nil, fmt.Errorf("scanner: shard %d: %w", i, err)
	}
	firedAt := b.Now.UnixMilli()
	msgs := make([]dispatch.Message, 0, len(due))
	sent := make([]shard.Entry, 0, len(due))
	for j, e := range due {
		typ := devs[j].Type
		thr := h.thr.For(e.ID, typ)
		ev := dispatch.Lost{
			ID:       dispatch.LostID(e.ID, e.Deadline),
			Device:   e.ID,
			Type:     typ,
			Deadline: e.Deadline,
			LastSeen: e.Deadline - thr.Milliseconds(),
			FiredAt:  firedAt,
			Shard:    i,
			Group:    devs[j].Group,
			Reason:   shard.ReasonSilence,
		}
		// A record for exactly this deadline says what put it there; an
		// offline report is a fact ingest received, not a silence an
		// outage could explain, so the outage rule does not defer it.
		silent := true
		if d := decls[j]; d.At == e.Deadline && d.Reason != "" {
			ev.Reason, ev.ConfirmAfter = d.Reason, d.Confirm
			ev.LastSeen = cmp.Or(d.LastSeen, e.Deadline-d.Confirm)
			silent = d.Reason == shard.ReasonExpired
			if silent {
				ev.Reason = shard.ReasonDeclared
			}
		}
		if silent {
			silence := time.Duration(e.Deadline-ev.LastSeen) * time.Millisecond
			if to, ok := deferral(e.Deadline, silence, b.Outages); ok {
				moves = append(moves, shard.Move{ID: e.ID, From: e.Deadline, To: to})
				continue
			}
		}
		msg, err := dispatch.Encode(h.pub.Subjects(), ev)
		if err != nil {
			return nil, nil, fmt.Errorf("scanner: encode lost event: %w", err)
		}
		msgs = append(msgs, msg)
		sent = append(sent, e)
	}

	// A replica resumed from a pause longer than its lease marks nothing:
	// the marks live beside the registry, where the lease cannot fence them.
	if !b.Held() {
		h.m.fenced.Add(float64(len(sent)))
		return nil, nil, fmt.Errorf("scanner: shard %d: lease ran out before marking: %w", i, queue.ErrFenced)
	}
	// The devices are marked lost before they are published, so that an
	// entry gone from its shard is always marked; a mark whose event is
	// not published is undone.
	prev, marks := h.store.LostMarks().SwapMulti(ctx, sent, firedAt)
	replaced := make(map[string]shard.PrevMark, len(sent))
	marked := make([]shard.Entry, 0, len(sent))
	publish := make([]dispatch.Message, 0, len(sent))
	var (
		earlier []string // ids of events an earlier owner marked too long ago for de-duplication
		since   int64
	)
	for j, e := range sent {
		if marks[j] != nil {
			if err == nil {
				err = fmt.Errorf("scanner: shard %d: %w", i, marks[j])
			}
			continue
		}
		marked = append(marked, e)
		publish = append(publish, msgs[j])
		replaced[e.ID] = prev[j]
		if p := prev[j]; p.Deadline == e.Deadline && firedAt-p.At > h.pub.Duplicates().Milliseconds()/2 {
			earlier = append(earlier, msgs[j].ID)
			since = min(cmp.Or(since, p.At), p.At)
		}
	}
	if len(earlier) > 0 {
		// The earlier owner may have published these before it stopped;
		// JetStream would not drop a second copy any more, so the stream
		// itself says which were stored. Anything stored is stored before
		// this owner's fence, so the answer is complete. The margin covers
		// the clock skew between that owner and the NATS server.
		stored, serr := h.pub.Stored(ctx, h.pub.Subjects().AllLost(), time.UnixMilli(since).Add(-storedSkew), earlier)
		if serr != nil {
			h.undo(ctx, marked, firedAt, replaced)
			return nil, moves, fmt.Errorf("scanner: shard %d: %w", i, serr)
		}
		keep := 0
		for j, e := range marked {
			if stored[publish[j].ID] {
				handled = append(handled, e)
				h.m.republishSkipped.Inc()
				continue
			}
			marked[keep], publish[keep] = e, publish[j]
			keep++
		}
		marked, publish = marked[:keep], publish[:keep]
	}
	if h.beforePublish != nil {
		h.beforePublish(i)
	}
	fence := h.pub.FenceOf(family, i, b.Fence)
	errs := h.pub.PublishFenced(ctx, fence, publish)
	var unpublished []shard.Entry
	for j, e := range marked {
		if errs[j] != nil {
			unpublished = append(unpublished, e)
			switch {
			case errors.Is(errs[j], dispatch.ErrFenced):
				h.m.fenced.Inc()
				err = fmt.Errorf("scanner: shard %d: %w: %w", i, queue.ErrFenced, errs[j])
			case err == nil:
				h.m.publishErrors.Inc()
				err = fmt.Errorf("scanner: shard %d: %w", i, errs[j])
			default:
				h.m.publishErrors.Inc()
			}
			continue
		}
		handled = append(handled, e)
		h.m.lost.Inc()
		h.m.fireLag.Observe(float64(firedAt-e.Deadline) / 1e3)
	}
	// Not removed: the entries are claimed and published again (by this
	// owner or the next); a mark left by a failed undo is written again then.
	h.undo(ctx, unpublished, firedAt, replaced)
	h.forgetDeclarations(ctx, due, decls, handled)
	return handled, moves, err
}

// forgetDeclarations drops the records of the handled entries that had
// one: they are spent.
func (h *lost) forgetDeclarations(ctx context.Context, due []shard.Entry, decls []shard.Declaration, handled []shard.Entry) {
	done := make(map[string]int64, len(handled))
	for _, e := range handled {
		done[e.ID] = e.Deadline
	}
	var spent []shard.Declaration
	for j, e := range due {
		if d := decls[j]; d.Reason != "" && d.At == e.Deadline && done[e.ID] == e.Deadline {
			spent = append(spent, d)
		}
	}
	h.store.ForgetDeclarations(ctx, spent)
}

// storedSkew is the clock skew between scanners and the NATS server that
// the look-up of events an earlier owner stored tolerates.
const storedSkew = time.Minute

// undo takes back the lost marks Fire wrote at firedAt for entries it does
// not hand back as handled, putting back the marks they replaced, unless
// the device was marked or cleared since.
func (h *lost) undo(ctx context.Context, es []shard.Entry, firedAt int64, replaced map[string]shard.PrevMark) {
	prev := make([]shard.PrevMark, len(es))
	for j, e := range es {
		prev[j] = replaced[e.ID]
	}
	for j, err := range h.store.LostMarks().UnmarkMulti(context.WithoutCancel(ctx), es, firedAt, prev) {
		if err != nil {
			h.log.Warn("lost mark of an unpublished event not undone", "device", es[j].ID, "err", err)
		}
	}
}

// deferral applies the outage rule (invariant 6): a device whose silence
// window [deadline-threshold, deadline] overlaps a recorded ingest outage is
// not declared lost; its deadline moves to a threshold after the last such
// outage ended.
func deferral(deadline int64, threshold time.Duration, outages []shard.Outage) (int64, bool) {
	since := deadline - threshold.Milliseconds()
	var to int64
	for _, o := range outages {
		if o.Start < deadline && o.End > since {
			to = max(to, o.End+threshold.Milliseconds())
		}
	}
	return to, to > 0
}

// Fired returns, for each id, the latest deadline the device surely fired
// at: just below its lost mark (0 if none). A device is marked lost before
// its entry is removed, so a mark stands for every fire that settled; but
// it is also written before the event is published, so at its own deadline
// it may be the mark of an owner that died before publishing. A copy due at
// that deadline fires again: its event has the same id, which JetStream
// and the earlier-owner check make one event, while taking the mark for a
// fire would lose the event for good.
func (h *lost) Fired(ctx context.Context, ids []string) ([]int64, error) {
	devs, err := h.store.Devices(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(ids))
	for j, d := range devs {
		if d.LostDeadline != 0 {
			out[j] = d.LostDeadline - 1
		}
	}
	return out, nil
}

// Revived handles a fired deadline that a reset revived between claim and
// settle: the device was declared lost and signalled again, so its lost
// mark is cleared and, if this call cleared it, a recovered event goes out
// with the type the mark was cleared from.
// Each step is retried until it succeeds or ctx is done; the event's id
// makes a repeat harmless.
func (h *lost) Revived(ctx context.Context, fired, revived shard.Entry) error {
	id := fired.ID
	var (
		dev     shard.Device
		cleared bool
	)
	err := h.retry(ctx, "lost mark not cleared", id, func() (err error) {
		dev, cleared, err = h.store.LostMarks().Clear(ctx, id, fired.Deadline)
		return err
	})
	if err != nil || !cleared {
		return err // !cleared: ingest saw the device come back and announced it.
	}
	ev := dispatch.Recovered{
		ID:          dispatch.RecoveredID(id, fired.Deadline),
		Device:      id,
		Type:        dev.Type,
		LostAt:      fired.Deadline,
		RecoveredAt: revived.Deadline - h.thr.For(id, dev.Type).Milliseconds(),
		Group:       dev.Group,
	}
	msg, err := dispatch.Encode(h.pub.Subjects(), ev)
	if err != nil {
		return fmt.Errorf("scanner: encode recovered event: %w", err)
	}
	return h.retry(ctx, "recovered event not published", id, func() error {
		err := h.pub.Publish(ctx, []dispatch.Message{msg})[0]
		if err != nil {
			h.m.publishErrors.Inc()
		}
		return err
	})
}

// retry calls f until it succeeds, waiting 50ms doubling up to 2s between
// attempts, or until ctx is done.
func (h *lost) retry(ctx context.Context, what, id string, f func() error) error {
	bo := backoff.Backoff{Policy: backoff.Policy{Base: 50 * time.Millisecond, Max: 2 * time.Second}}
	for {
		err := f()
		if err == nil {
			return nil
		}
		h.log.Warn(what+"; retrying", "device", id, "err", err)
		if !bo.Wait(ctx) {
			return fmt.Errorf("scanner: %s of %s: %w", what, id, err)
		}
	}
}
