package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// A lapsing fence fences the publishes of work no shard owns (the
// notifications of events a durable consumer hands to any replica). Its
// fence message carries a time to live (Nats-TTL), so the stream itself
// removes it: from then on the stream refuses every publish fenced by it,
// whoever is left to notice. A publisher takes a fence before it reads
// what it will publish, so whatever it publishes under the fence is stored
// within the fence's time to live of that read, or refused (ErrFenced):
// a process paused longer, with publishes in hand or in its client's
// buffers, publishes nothing once released. The time to live is half the
// de-duplication window, so a publish the fence lets through is still
// within the window of any earlier copy stored after that read.
//
// A fence is renewed on fresh subjects well before it lapses, so that
// publishes in flight under the last one are not refused. It spreads over
// lanes, one subject each: a replicated stream checks one fence of a
// subject at a time.

// Lapsing hands out the lapsing fences of one process. It is safe for
// concurrent use. In core mode, or on a server without per-message TTLs,
// it hands out the zero Fence: nothing is fenced.
type Lapsing struct {
	p      *Bus
	scope  string
	owner  string // the process, in fence bodies
	member string // the process, in fence subjects
	lanes  int
	ttl    time.Duration

	mu     sync.Mutex
	fences []Fence
	taken  time.Time // when fences were asked for
	gen    uint64
	next   atomic.Uint64
}

// Lapsing returns the lapsing fences of scope for this process (owner
// names it in the fence messages), spread over lanes subjects.
func (p *Bus) Lapsing(scope, owner string, lanes int) *Lapsing {
	return &Lapsing{p: p, scope: SanitizeType(scope), owner: owner, member: nuid.Next(), lanes: max(1, lanes),
		ttl: LapseTTL(p.opts.Duplicates)}
}

// LapseTTL is the time to live of a lapsing fence for de-duplication
// window dup: half of it, in whole seconds (Nats-TTL's unit), at least 1s.
func LapseTTL(dup time.Duration) time.Duration {
	return max(time.Second, (dup / 2).Truncate(time.Second))
}

// renewAfter is the age at which a lapsing fence is replaced: a publish
// that takes one has three quarters of its life left to be stored.
func (l *Lapsing) renewAfter() time.Duration { return l.ttl / 4 }

// Take returns a fence to publish under, renewing the process's fences
// first when they are due. Take it before reading the state whose
// notifications go out under it.
func (l *Lapsing) Take(ctx context.Context) (Fence, error) {
	if l.p.opts.Mode != JetStream || !l.p.ttl {
		return Fence{}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fences == nil || time.Since(l.taken) >= l.renewAfter() {
		if err := l.renew(ctx); err != nil {
			return Fence{}, err
		}
	}
	return l.fences[l.next.Add(1)%uint64(len(l.fences))], nil
}

// renew publishes a fence message on each lane's subject of a new
// generation.
func (l *Lapsing) renew(ctx context.Context) error {
	taken := time.Now()
	l.gen++
	body, err := json.Marshal(fenceBody{Owner: l.owner, Token: int64(l.gen)})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.p.opts.AckWait)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, l.lanes)
	subjects := make([]string, l.lanes)
	for i := range futures {
		subjects[i] = l.p.subjects.lapse(l.scope, l.member, l.gen, i)
		m := nats.NewMsg(subjects[i])
		m.Data = body
		m.Header.Set(jetstream.MsgTTLHeader, strconv.FormatInt(int64(l.ttl/time.Second), 10))
		if futures[i], err = l.p.js.PublishMsgAsync(m); err != nil {
			return fmt.Errorf("dispatch: fence %s: %w", subjects[i], err)
		}
	}
	fences := make([]Fence, l.lanes)
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			fences[i] = Fence{Subject: subjects[i], Seq: ack.Sequence}
		case err := <-f.Err():
			return fmt.Errorf("dispatch: fence %s: %w", subjects[i], err)
		case <-ctx.Done():
			return fmt.Errorf("dispatch: fence %s: no ack: %w", subjects[i], ctx.Err())
		}
	}
	l.fences, l.taken = fences, taken
	return nil
}

// lapse is the subject of lane i of generation gen of member's lapsing
// fences of scope: internal tokens only, never a device id.
func (s Subjects) lapse(scope, member string, gen uint64, i int) string {
	return s.prefix() + ".fence." + scope + "." + member + "." + strconv.FormatUint(gen, 10) + "." + strconv.Itoa(i)
}
