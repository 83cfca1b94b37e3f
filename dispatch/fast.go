package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// On a single-server stream (see takesFast), a shard's fenced events go
// out as a JetStream fast batch (nats-server 2.14+, a stream with
// allow_batched): every message keeps its Nats-Msg-Id and the fence, the
// stream stores them one by one as they come, and instead of an
// acknowledgement per message it answers the batch's commit with how many
// of its first messages it stored ("gap: fail": it stops at the first it
// refuses, and stores nothing after it). What it stored is published; the
// rest, whatever the reason (a fence, no answer, a server that cannot take
// the batch), goes out again message by message, where the fence and
// de-duplication decide as before.

// fastFlow is the acknowledgement interval asked of the server. Flow
// acknowledgements only pace a publisher that waits for them; a shard's
// batch is bounded by the scanner's batch size, so none is awaited.
const fastFlow = 500

// Fast batch operations (the reply subject's last token but one).
const (
	fastStart  = "0"
	fastAppend = "1"
	fastCommit = "2"
)

// fastInbox receives the server's answers to the publisher's fast
// batches on one wildcard subscription.
type fastInbox struct {
	prefix string
	sub    *nats.Subscription

	mu      sync.Mutex
	waiting map[string]chan fastAnswer // by batch id
}

// fastAnswer is the stream's answer to a fast batch's commit: how many of
// its first messages are stored, or why it answered nothing of the kind.
type fastAnswer struct {
	count int
	err   error
}

func newFastInbox(nc *nats.Conn) (*fastInbox, error) {
	in := &fastInbox{prefix: nats.NewInbox(), waiting: map[string]chan fastAnswer{}}
	sub, err := nc.Subscribe(in.prefix+".>", in.receive)
	if err != nil {
		return nil, fmt.Errorf("dispatch: fast batch inbox: %w", err)
	}
	in.sub = sub
	return in, nil
}

// receive handles one answer: flow acknowledgements, gaps and per-message
// errors are ignored (the commit's count says what was stored); the
// commit's answer goes to the batch's waiter.
func (in *fastInbox) receive(m *nats.Msg) {
	if bytes.HasPrefix(m.Data, []byte(`{"type":`)) {
		return
	}
	rest := strings.TrimPrefix(m.Subject, in.prefix+".")
	id, _, _ := strings.Cut(rest, ".")
	var ack struct {
		Count int `json:"count"`
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	a := fastAnswer{}
	switch err := json.Unmarshal(m.Data, &ack); {
	case err != nil:
		a.err = fmt.Errorf("unreadable answer %q", m.Data)
	case ack.Error != nil:
		a.err = fmt.Errorf("%s (%d)", ack.Error.Description, ack.Error.ErrCode)
	default:
		a.count = ack.Count
	}
	in.mu.Lock()
	ch := in.waiting[id]
	delete(in.waiting, id)
	in.mu.Unlock()
	if ch != nil {
		ch <- a
	}
}

// expect registers batch id's waiter before its messages go out.
func (in *fastInbox) expect(id string) chan fastAnswer {
	ch := make(chan fastAnswer, 1)
	in.mu.Lock()
	in.waiting[id] = ch
	in.mu.Unlock()
	return ch
}

func (in *fastInbox) forget(id string) {
	in.mu.Lock()
	delete(in.waiting, id)
	in.mu.Unlock()
}

// publishFast publishes msgs under fence f as one fast batch; what the
// stream did not confirm goes out message by message.
func (p *Bus) publishFast(ctx context.Context, f Fence, msgs []Message) []error {
	stored, err := p.commitFast(ctx, f, msgs)
	if stored == len(msgs) {
		p.fastBatches.Inc()
		return make([]error, len(msgs))
	}
	if ctx.Err() != nil {
		errs := make([]error, len(msgs))
		for j := stored; j < len(msgs); j++ {
			errs[j] = fmt.Errorf("dispatch: publish %s: %w", msgs[j].Subject, cmpErr(err, ctx.Err()))
		}
		return errs
	}
	p.fastFallbacks.Inc()
	errs := make([]error, len(msgs))
	copy(errs[stored:], p.publishEach(ctx, f, msgs[stored:]))
	return errs
}

// cmpErr is err, or alt when err is nil.
func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// sendFast publishes msgs as the fast batch id, each with the reply
// subject that frames it (start, append, commit); their answer comes on
// fastIn. The messages are modified.
func (p *Bus) sendFast(id string, msgs []*nats.Msg) error {
	last := len(msgs) - 1
	head := p.fastIn.prefix + "." + id + "." + strconv.Itoa(fastFlow) + ".fail."
	for k, m := range msgs {
		op := fastAppend
		switch {
		case k == last:
			op = fastCommit
		case k == 0:
			op = fastStart
		}
		m.Reply = head + strconv.Itoa(k+1) + "." + op + ".$FI"
		if err := p.nc.PublishMsg(m); err != nil {
			return err
		}
	}
	return nil
}

// commitFast sends msgs as one fast batch and returns how many of its
// first messages the stream confirms stored (0 when it confirms nothing).
func (p *Bus) commitFast(ctx context.Context, f Fence, msgs []Message) (int, error) {
	id := p.batchIDs.next()
	answer := p.fastIn.expect(id)
	defer p.fastIn.forget(id)
	out := make([]*nats.Msg, len(msgs))
	for j, m := range msgs {
		nm := nats.NewMsg(m.Subject)
		nm.Data = m.Body
		nm.Header.Set(jetstream.MsgIDHeader, m.ID)
		f.apply(nm)
		out[j] = nm
	}
	if err := p.sendFast(id, out); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckWait)
	defer cancel()
	select {
	case a := <-answer:
		return min(a.count, len(msgs)), a.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
