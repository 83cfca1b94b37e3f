package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A shard's events are fenced in the stream itself. Each owner of a shard,
// on taking its lease, publishes a fence message on the shard's fence
// subject and keeps the sequence the stream stored it at. Every event it
// publishes for the shard asks the stream to store it only if that fence
// is still the last message on the fence subject
// (Nats-Expected-Last-Subject-Sequence with -Subject). A later owner's
// fence moves the subject on, so the stream refuses whatever an earlier
// owner publishes from then on, however long that owner was paused and
// whatever its client still had buffered. Nats-Msg-Id de-duplication stays
// as the second line.

// ErrFenced says the stream refused a publish because another owner has
// fenced the shard since, or the publisher's lapsing fence has lapsed
// (lapse.go): the publisher's hold is lost.
var ErrFenced = errors.New("dispatch: fenced out: another owner has taken the shard, or the fence lapsed")

// Fence is an owner's hold on the events of one shard: the fence subject
// and the stream sequence of the owner's fence message on it. The zero
// Fence fences nothing (core NATS).
type Fence struct {
	Subject string
	Seq     uint64
}

// Fence is the internal subject of the fence of shard i of a timer family
// (scope): one token each, never a device id.
func (s Subjects) Fence(scope string, i int) string {
	return s.prefix() + ".fence." + SanitizeType(scope) + "." + strconv.Itoa(i)
}

// fenceBody is the body of a fence message, for people reading the stream.
type fenceBody struct {
	Owner string `json:"owner"`
	Token int64  `json:"token"`
}

// Fence fences shard i of scope for owner, whose lease carries token: from
// the moment it returns, publishes fenced by any earlier Fence of the shard
// are refused. In core mode it returns the zero Fence: core NATS cannot
// fence.
func (p *Bus) Fence(ctx context.Context, scope string, i int, owner string, token int64) (Fence, error) {
	if p.opts.Mode != JetStream {
		return Fence{}, nil
	}
	subj := p.subjects.Fence(scope, i)
	body, err := json.Marshal(fenceBody{Owner: owner, Token: token})
	if err != nil {
		return Fence{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckWait)
	defer cancel()
	ack, err := p.js.Publish(ctx, subj, body)
	if err != nil {
		return Fence{}, fmt.Errorf("dispatch: fence %s: %w", subj, err)
	}
	return Fence{Subject: subj, Seq: ack.Sequence}, nil
}

// FenceOf is the fence of shard i of scope at sequence seq, as Fence
// returned it; seq 0 (no fence taken, or core NATS) is the zero Fence.
func (p *Bus) FenceOf(scope string, i int, seq uint64) Fence {
	if seq == 0 || p.opts.Mode != JetStream {
		return Fence{}
	}
	return Fence{Subject: p.subjects.Fence(scope, i), Seq: seq}
}

// PublishFenced is Publish with every message fenced by f: a message the
// stream refuses because f is no longer the shard's last fence fails with
// ErrFenced. With the zero Fence it is Publish.
func (p *Bus) PublishFenced(ctx context.Context, f Fence, msgs []Message) []error {
	return p.publish(ctx, f, msgs)
}

// apply sets the headers that make the stream store m only under f.
func (f Fence) apply(m *nats.Msg) {
	if f.Subject == "" {
		return
	}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(f.Seq, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, f.Subject)
}

// isFenced reports whether err is the stream's refusal of a fenced publish:
// the fence subject's last message is not the fence (10071, "wrong last
// sequence: <seq>").
func isFenced(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// isFenceBusy reports whether err is a replicated stream's refusal to check
// a fence while another message checking the same fence subject is being
// replicated (10164, "wrong last sequence" without a sequence). The fence
// was not checked and nothing was stored: the message may go out again.
// A single-server stream checks fences one after another and never says so.
func isFenceBusy(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// Duplicates returns the stream's de-duplication window (nats.duplicates).
func (p *Bus) Duplicates() time.Duration { return p.opts.Duplicates }

// storedBatch is how many message headers Stored reads per request.
const storedBatch = 1000

// Stored returns which of ids are the Nats-Msg-Id of a message the stream
// stored on a subject matching filter since the given time (by the
// server's clock), up to its last message at the call. It reads headers
// only. A new owner of a shard asks it for events an earlier owner marked
// more than the de-duplication window ago: JetStream would no longer drop
// their re-publish, so what was stored must not be published again. In
// core mode nothing is stored and it returns nothing.
func (p *Bus) Stored(ctx context.Context, filter string, since time.Time, ids []string) (map[string]bool, error) {
	found := map[string]bool{}
	if p.opts.Mode != JetStream || len(ids) == 0 {
		return found, nil
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	ctx, cancel := context.WithTimeout(ctx, 4*p.opts.AckWait)
	defer cancel()
	s, err := p.js.Stream(ctx, p.opts.Stream)
	if err != nil {
		return nil, fmt.Errorf("dispatch: stored events: %w", err)
	}
	last := s.CachedInfo().State.LastSeq
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter},
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since, HeadersOnly: true})
	if err != nil {
		return nil, fmt.Errorf("dispatch: stored events: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("dispatch: stored events: %w", err)
	}
	if info.NumPending == 0 {
		return found, nil
	}
	for len(found) < len(want) {
		batch, err := cons.Fetch(storedBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("dispatch: stored events: %w", err)
		}
		n, done := 0, false
		for m := range batch.Messages() {
			n++
			if id := m.Headers().Get(nats.MsgIdHdr); want[id] {
				found[id] = true
			}
			if md, err := m.Metadata(); err == nil && (md.Sequence.Stream >= last || md.NumPending == 0) {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("dispatch: stored events: %w", err)
		}
		if done || n == 0 {
			break
		}
	}
	return found, nil
}
