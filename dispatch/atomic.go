package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// On a replicated stream (see takesAtomic), a shard's fenced events go out
// as JetStream atomic batches (nats-server 2.12+, a stream with
// allow_atomic): the stream checks the fence once, on
// the batch's first message, and stores the whole batch or nothing, with
// one acknowledgement for all of it. A replicated stream checks one fence of
// a subject at a time and refuses what comes meanwhile; a shard has one
// batch in flight, so its events do not go out one at a time. Anything the batch path cannot settle
// (an event stored before, whose id the stream refuses inside an atomic
// batch; too many batches in flight; no answer) goes out again message by
// message, where de-duplication and the fence hold as before.

// The headers of an atomic batch.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

const (
	// maxAtomicBatch is the largest atomic batch sent: the server's
	// default limit.
	maxAtomicBatch = 1000
	// maxAtomicInflight bounds the atomic batches a publisher has in
	// flight, below the server's default of 50 per stream.
	maxAtomicInflight = 32
)

// batchIDs names atomic and fast batches: a prefix unique to the process
// and a counter, well under the server's 64 characters, and without a dot
// (a fast batch's id is a token of its reply subjects).
type batchIDs struct {
	prefix string
	n      atomic.Uint64
}

func newBatchIDs() *batchIDs {
	return &batchIDs{prefix: strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix)}
}

func (b *batchIDs) next() string {
	return b.prefix + "-" + strconv.FormatUint(b.n.Add(1), 36)
}

// batchAck is the stream's answer to a batch's commit.
type batchAck struct {
	Count int `json:"count"`
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// errBatchRefused says the stream refused an atomic batch for a reason
// that sending its messages one by one may not have: they go out so.
var errBatchRefused = errors.New("dispatch: atomic batch refused")

// publishAtomic publishes msgs under fence f in atomic batches. A batch
// the fence refuses fails with ErrFenced, as does everything after it; any
// other failure of a batch sends its messages one by one.
func (p *Bus) publishAtomic(ctx context.Context, f Fence, msgs []Message) []error {
	errs := make([]error, len(msgs))
	for lo := 0; lo < len(msgs); lo += maxAtomicBatch {
		hi := min(lo+maxAtomicBatch, len(msgs))
		err := p.commitAtomic(ctx, f, msgs[lo:hi])
		switch {
		case err == nil:
			p.atomicBatches.Inc()
		case errors.Is(err, ErrFenced):
			for j := lo; j < len(msgs); j++ {
				errs[j] = fmt.Errorf("dispatch: publish %s: %w", msgs[j].Subject, err)
			}
			return errs
		case ctx.Err() != nil:
			for j := lo; j < len(msgs); j++ {
				errs[j] = fmt.Errorf("dispatch: publish %s: %w", msgs[j].Subject, err)
			}
			return errs
		default:
			p.atomicFallbacks.Inc()
			copy(errs[lo:hi], p.publishEach(ctx, f, msgs[lo:hi]))
		}
	}
	return errs
}

// commitAtomic sends msgs as one atomic batch, the fence on its first
// message, and waits for the commit's acknowledgement.
func (p *Bus) commitAtomic(ctx context.Context, f Fence, msgs []Message) error {
	select {
	case p.atomicRoom <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.atomicRoom }()
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckWait)
	defer cancel()
	id := p.batchIDs.next()
	last := len(msgs) - 1
	for j, m := range msgs {
		nm := nats.NewMsg(m.Subject)
		nm.Data = m.Body
		nm.Header.Set(jetstream.MsgIDHeader, m.ID)
		nm.Header.Set(batchIDHeader, id)
		nm.Header.Set(batchSeqHeader, strconv.Itoa(j+1))
		if j == 0 {
			f.apply(nm)
		}
		if j < last {
			if err := p.nc.PublishMsg(nm); err != nil {
				return err
			}
			continue
		}
		nm.Header.Set(batchCommitHeader, "1")
		reply, err := p.nc.RequestMsgWithContext(ctx, nm)
		if err != nil {
			return fmt.Errorf("%w: %w", errBatchRefused, err)
		}
		var ack batchAck
		if err := json.Unmarshal(reply.Data, &ack); err != nil {
			return fmt.Errorf("%w: unreadable answer %q", errBatchRefused, reply.Data)
		}
		switch {
		case ack.Error != nil && ack.Error.ErrCode == int(jetstream.JSErrCodeStreamWrongLastSequence):
			return fmt.Errorf("%w (%s)", ErrFenced, ack.Error.Description)
		case ack.Error != nil:
			return fmt.Errorf("%w: %s (%d)", errBatchRefused, ack.Error.Description, ack.Error.ErrCode)
		case ack.Count != len(msgs):
			return fmt.Errorf("%w: %d of %d messages committed", errBatchRefused, ack.Count, len(msgs))
		}
	}
	return nil
}
