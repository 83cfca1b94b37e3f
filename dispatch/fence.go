package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

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
// fenced the shard since: the publisher's lease is lost.
var ErrFenced = errors.New("dispatch: fenced out: another owner has taken the shard")

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
func (p *Publisher) Fence(ctx context.Context, scope string, i int, owner string, token int64) (Fence, error) {
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
func (p *Publisher) FenceOf(scope string, i int, seq uint64) Fence {
	if seq == 0 || p.opts.Mode != JetStream {
		return Fence{}
	}
	return Fence{Subject: p.subjects.Fence(scope, i), Seq: seq}
}

// PublishFenced is Publish with every message fenced by f: a message the
// stream refuses because f is no longer the shard's last fence fails with
// ErrFenced. With the zero Fence it is Publish.
func (p *Publisher) PublishFenced(ctx context.Context, f Fence, msgs []Message) []error {
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

// isFenced reports whether err is the stream's refusal of a fenced publish.
func isFenced(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
