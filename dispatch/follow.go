package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Kinds a reader of the event stream chooses among (GET /v1/events?kind=).
// Fences are internal and never followed.
const (
	KindLost    = "lost" // lost and recovered
	KindAlarms  = "alarms"
	KindStorms  = "storms"
	KindSystem  = "system"
	KindTimers  = "timers"
	KindInvalid = "invalid"
)

// Kinds lists every kind, in the order they are documented.
var Kinds = []string{KindLost, KindAlarms, KindStorms, KindSystem, KindTimers, KindInvalid}

// ErrBadKind refuses a kind not in Kinds.
var ErrBadKind = errors.New("unknown event kind")

// ErrNoStream says events cannot be followed: in NATS core mode there is
// no stream to read them from.
var ErrNoStream = errors.New("following events needs nats.mode jetstream (there is no stream in core mode)")

// kindSubjects are the stream subjects of kind.
func (s Subjects) kindSubjects(kind string) ([]string, error) {
	p := s.prefix()
	switch kind {
	case KindLost:
		return []string{p + ".lost.>", p + ".recovered.>"}, nil
	case KindAlarms:
		return []string{p + ".alarm.>"}, nil
	case KindStorms:
		return []string{p + ".storm"}, nil
	case KindSystem:
		return []string{p + ".system"}, nil
	case KindTimers:
		return []string{p + ".timer.>"}, nil
	case KindInvalid:
		return []string{p + ".invalid"}, nil
	}
	return nil, fmt.Errorf("%w %q: use %s", ErrBadKind, kind, strings.Join(Kinds, ", "))
}

// FollowOptions choose the events a follower reads and where it starts:
// After, else Last, else Since, else with the next new event.
type FollowOptions struct {
	Kinds  []string // none: every kind
	Device string   // only this device's events (read from the body: ids are never in subjects)
	After  uint64   // resume after this stream sequence
	Last   int      // start with the last Last matching events
	Since  time.Time
}

// StreamEvent is one event read from the stream.
type StreamEvent struct {
	Seq  uint64 // the stream sequence, to resume after
	Name string // the subject's second token: lost, recovered, alarm, storm, system, timer, invalid
	Time time.Time
	Body json.RawMessage
}

// EventStream is a running follower: an ordered consumer, which the
// client library recreates at the right sequence when its connection or
// the consumer breaks.
type EventStream struct {
	it     jetstream.MessagesContext
	device string
}

// lastScan bounds the stream sequences a Last search reads back.
const lastScan = 1 << 20

// Follow starts reading the stream's events as o says.
func (p *Bus) Follow(ctx context.Context, o FollowOptions) (*EventStream, error) {
	if p.js == nil {
		return nil, ErrNoStream
	}
	kinds := o.Kinds
	if len(kinds) == 0 {
		kinds = Kinds
	}
	var filters []string
	for _, k := range kinds {
		f, err := p.subjects.kindSubjects(k)
		if err != nil {
			return nil, err
		}
		filters = append(filters, f...)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverNewPolicy}
	switch {
	case o.After > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, o.After+1
	case o.Last > 0:
		seq, err := p.lastStart(ctx, filters, o.Device, o.Last)
		if err != nil {
			return nil, err
		}
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq
	case !o.Since.IsZero():
		since := o.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := p.js.OrderedConsumer(ctx, p.opts.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("events: stream %s: %w", p.opts.Stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("events: stream %s: %w", p.opts.Stream, err)
	}
	return &EventStream{it: it, device: o.Device}, nil
}

// Next returns the next event, or false when none came within wait.
func (s *EventStream) Next(ctx context.Context, wait time.Duration) (StreamEvent, bool, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		msg, err := s.it.Next(jetstream.NextContext(wctx))
		switch {
		case ctx.Err() != nil:
			return StreamEvent{}, false, ctx.Err()
		case wctx.Err() != nil:
			return StreamEvent{}, false, nil
		case err != nil:
			return StreamEvent{}, false, fmt.Errorf("events: %w", err)
		}
		ev, ok := eventOf(msg, s.device)
		if ok {
			return ev, true, nil
		}
	}
}

// Stop ends the follower.
func (s *EventStream) Stop() { s.it.Stop() }

// eventOf reads msg, and says whether it is device's (any when "").
func eventOf(msg jetstream.Msg, device string) (StreamEvent, bool) {
	ev := StreamEvent{Body: msg.Data()}
	if _, rest, ok := strings.Cut(msg.Subject(), "."); ok {
		ev.Name, _, _ = strings.Cut(rest, ".")
	}
	if md, err := msg.Metadata(); err == nil {
		ev.Seq, ev.Time = md.Sequence.Stream, md.Timestamp
	}
	return ev, device == "" || isDevice(msg.Data(), device)
}

func isDevice(body []byte, device string) bool {
	var b struct {
		Device string `json:"device"`
	}
	return json.Unmarshal(body, &b) == nil && b.Device == device
}

// lastStart is the sequence of the n-th last event on filters (of device,
// when given) among the last lastScan of the stream: windows back from
// the end grow until they hold n, reach the stream's start or the bound.
// With none, it is the sequence after the end.
func (p *Bus) lastStart(ctx context.Context, filters []string, device string, n int) (uint64, error) {
	st, err := p.js.Stream(ctx, p.opts.Stream)
	if err != nil {
		return 0, fmt.Errorf("events: stream %s: %w", p.opts.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("events: stream %s: %w", p.opts.Stream, err)
	}
	first, end := info.State.FirstSeq, info.State.LastSeq
	if end == 0 || end < first {
		return end + 1, nil
	}
	for w := uint64(max(64, 4*n)); ; w *= 4 {
		start := first
		if end-first+1 > w {
			start = end - w + 1
		}
		seqs, err := p.matches(ctx, filters, device, start, end)
		if err != nil {
			return 0, err
		}
		if len(seqs) >= n {
			return seqs[len(seqs)-n], nil
		}
		if start == first || w >= lastScan {
			if len(seqs) > 0 {
				return seqs[0], nil
			}
			return end + 1, nil
		}
	}
}

// matches lists the sequences from start to end of the events on filters
// (of device, when given).
func (p *Bus) matches(ctx context.Context, filters []string, device string, start, end uint64) ([]uint64, error) {
	cons, err := p.js.OrderedConsumer(ctx, p.opts.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: filters,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start})
	if err != nil {
		return nil, fmt.Errorf("events: stream %s: %w", p.opts.Stream, err)
	}
	var seqs []uint64
	for {
		batch, err := cons.FetchNoWait(512)
		if err != nil {
			return nil, fmt.Errorf("events: stream %s: %w", p.opts.Stream, err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			ev, ok := eventOf(msg, device)
			if ev.Seq > end {
				return seqs, nil
			}
			if ok {
				seqs = append(seqs, ev.Seq)
			}
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("events: stream %s: %w", p.opts.Stream, err)
		}
		if got == 0 {
			return seqs, nil
		}
	}
}
