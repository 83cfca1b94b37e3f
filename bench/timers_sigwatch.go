package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/timer"
)

// sigwatchTimers runs sigwatch's generic timers once with n timers: it
// starts the timer service on an empty Redis and loads them, then measures
// resets and lateness, the deadlines set as far apart as peer's.
func (r *runner) sigwatchTimers(ctx context.Context, n int, peer timerRun) (timerRun, error) {
	var out timerRun
	if err := r.e.flush(ctx); err != nil {
		return out, err
	}
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	topo, err := shard.NewWatcher(ctx, store, shards, 500*time.Millisecond, nil)
	if err != nil {
		return out, err
	}
	pub, err := dispatch.New(ctx, r.e.nc, dispatch.Options{})
	if err != nil {
		return out, err
	}
	defer pub.Close()
	rc, err := newRedisClient(r.e.redis.Addr)
	if err != nil {
		return out, err
	}
	defer rc.Close()
	reg := prometheus.NewRegistry()
	svc, err := timer.New(timer.Options{Replica: fmt.Sprintf("bench-%d", time.Now().UnixNano()), Fire: true, Config: timer.Config{NATS: true},
		Consume: true}, shard.NewStore(rc, shard.NewKeys("sw")), topo, pub, reg, nil)
	if err != nil {
		return out, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { topo.Run(rctx) })
	wg.Go(func() { _ = svc.Run(rctx) })
	if !waitFor(ctx, 15*time.Second, func() bool { return len(svc.Owned()) == shards }) {
		return out, fmt.Errorf("the timer engine owns %d of %d shards after 15s", len(svc.Owned()), shards)
	}

	const queue = "bench"
	ids := deviceIDs(n)
	far := time.Now().Add(10 * time.Minute).UnixMilli()
	m0, err := r.e.usedMemory(ctx)
	if err != nil {
		return out, err
	}
	r.p.Printf("timers", "sigwatch: %d timers", n)
	if err := parallelChunks(ctx, n, 1000, 8, func(lo, hi int) error {
		rs := make([]shard.TimerReset, 0, hi-lo)
		for _, id := range ids[lo:hi] {
			rs = append(rs, shard.TimerReset{Member: shard.TimerMember(queue, id), Deadline: far})
		}
		return svc.Reset(ctx, rs)
	}); err != nil {
		return out, err
	}
	m1, err := r.e.usedMemory(ctx)
	if err != nil {
		return out, err
	}
	out.bytes = float64(m1-m0) / float64(n)

	// Resets over NATS: publishers keep a backlog in the reset stream; the
	// rate is what sigwatch stored (and then acknowledged) per second.
	js, err := jetstream.New(r.e.nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		return out, err
	}
	stored := func() float64 { return counterValue(reg, "sigwatch_timers_resets_total") }
	resetRate := func(per int) (float64, uint64, error) {
		// The bodies are made beforehand, so that the load generator's JSON
		// is not counted as sigwatch's work.
		var bodies [][]byte
		for lo := 0; lo < n; lo += per {
			batch := make([]timer.Request, 0, per)
			for _, id := range ids[lo:min(lo+per, n)] {
				batch = append(batch, timer.Request{ID: id, After: json.RawMessage(`"10m"`)})
			}
			var data []byte
			if per == 1 {
				data, _ = json.Marshal(batch[0])
			} else {
				data, _ = json.Marshal(batch)
			}
			bodies = append(bodies, data)
		}
		pctx, stop := context.WithCancel(ctx)
		var pubErr atomic.Pointer[error]
		var pw sync.WaitGroup
		pw.Go(func() {
			for j := 0; pctx.Err() == nil; j++ {
				m := &nats.Msg{Subject: "sigwatch.timers.set." + queue, Data: bodies[j%len(bodies)]}
				if err := publishAsync(pctx, js, m); err != nil && pctx.Err() == nil {
					pubErr.Store(&err)
					return
				}
			}
		})
		time.Sleep(time.Second) // warm-up: a backlog forms
		s0, t0 := stored(), time.Now()
		time.Sleep(r.prof.PeerFor)
		rate := (stored() - s0) / time.Since(t0).Seconds()
		stop()
		pw.Wait()
		backlog, _, _ := pub.TimerBacklog(ctx)
		// The publishers kept a backlog on purpose; what is left of it is
		// dropped, not drained (minutes at a message per reset), so that
		// the next measurement starts clean and the timers' watermark,
		// which a waiting reset holds back, moves again.
		if st, err := js.Stream(ctx, pub.TimerStream()); err == nil {
			_ = st.Purge(ctx)
		}
		waitFor(ctx, time.Minute, func() bool { b, _, _ := pub.TimerBacklog(ctx); return b == 0 })
		if e := pubErr.Load(); e != nil {
			return 0, 0, *e
		}
		// What the service pulled before the purge it still stores; a
		// late reset would count in the next rate, or push back a deadline
		// the lateness sets.
		if err := r.settle(ctx, stored, fmt.Sprintf("%d per message", per)); err != nil {
			return 0, 0, err
		}
		return rate, backlog, nil
	}
	cpu := r.newCPUMeter(ctx, nil)
	c0 := cpu.sample()
	if out.resets, out.backlog, err = resetRate(timersBatch); err != nil {
		return out, err
	}
	out.cpu = cpu.since(c0)
	if out.single, _, err = resetRate(1); err != nil {
		return out, err
	}
	c0 = cpu.sample()
	if out.requested, out.requestMissed, err = r.requestRate(ctx, queue, ids); err != nil {
		return out, err
	}
	out.requestCPU = cpu.since(c0)
	r.p.Printf("timers", "sigwatch: %.0f resets/s (%d per message), %.0f/s one per message, %.0f B per timer",
		out.resets, timersBatch, out.single, out.bytes)

	// Lateness.
	var (
		mu   sync.Mutex
		lags []float64
	)
	// Each fire is timed when the stream has stored it: an ordered consumer
	// of the event stream, as the NATS-native side reads its markers.
	js2, err := jetstream.New(r.e.nc)
	if err != nil {
		return out, err
	}
	evs, err := js2.OrderedConsumer(ctx, "SIGWATCH", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"sigwatch.timer." + queue}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return out, err
	}
	cc, err := evs.Consume(func(m jetstream.Msg) {
		now := time.Now()
		var ev struct {
			Deadline int64 `json:"deadline"`
		}
		if json.Unmarshal(m.Data(), &ev) == nil {
			mu.Lock()
			lags = append(lags, float64(now.UnixMicro()-ev.Deadline*1000)/1e3)
			mu.Unlock()
		}
	})
	if err != nil {
		return out, err
	}
	defer cc.Stop()
	measure := func(k int, deadline func(j int) int64) (lagStats, error) {
		mu.Lock()
		lags = nil
		mu.Unlock()
		rs := make([]shard.TimerReset, k)
		last := int64(0)
		for j := range rs {
			rs[j] = shard.TimerReset{Member: shard.TimerMember(queue, ids[j]), Deadline: deadline(j), Set: true}
			last = max(last, rs[j].Deadline)
		}
		for lo := 0; lo < k; lo += 1000 {
			if err := svc.Reset(ctx, rs[lo:min(lo+1000, k)]); err != nil {
				return lagStats{}, err
			}
		}
		// A busy machine drains the reset backlog slowly, and the timers'
		// watermark waits for it: wait rather than abort the scenario.
		waitFor(ctx, time.Until(time.UnixMilli(last))+3*time.Minute, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(lags) >= k
		})
		mu.Lock()
		defer mu.Unlock()
		if len(lags) < k {
			// Timers fire only up to the watermark, which a waiting reset
			// holds back: say whether one does.
			why := "no reset waits in the stream"
			if b, oldest, err := pub.TimerBacklog(ctx); err != nil || b > 0 {
				why = fmt.Sprintf("reset backlog %d, the oldest published at %s (%v)", b, oldest.Format(time.RFC3339Nano), err)
			}
			return lagStats{}, fmt.Errorf("%d of %d timer events arrived; %s", len(lags), k, why)
		}
		return summarize(lags), nil
	}
	// The deadlines fall the same distance apart as the NATS-native side's.
	start := time.Now().Add(2 * time.Second)
	k := len(peer.spreadAt)
	if out.spread, err = measure(k, func(j int) int64 { return start.UnixMilli() + peer.spreadAt[j] }); err != nil {
		return out, err
	}
	r.p.Printf("timers", "sigwatch: %d due over %s: %s", k, r.prof.LagWindow, out.spread)
	at := time.Now().Add(5 * time.Second).UnixMilli()
	stopProf := r.cpuProfile("timers-burst", fmt.Sprintf("timer service firing %d timers due at once (scenario 9)", min(r.prof.Burst, n)))
	cpu = r.newCPUMeter(ctx, nil)
	c0 = cpu.sample()
	out.once, err = measure(len(peer.onceAt), func(j int) int64 { return at + peer.onceAt[j] })
	out.onceCPU = cpu.since(c0)
	stopProf()
	if err != nil {
		return out, err
	}
	r.p.Printf("timers", "sigwatch: %d due at once: %s", min(r.prof.Burst, n), out.once)
	return out, nil
}

// requestRate measures resets sent one per core NATS request, each
// answered once stored, with natsInFlight requests in flight: the rate of
// answers that say stored, over the profile's peer window. A request
// unanswered after requestTimeout gives its slot back, as a client's
// timeout would (core NATS may drop a request on a busy machine), and
// counts in missed with the refused ones: the measurement goes on.
func (r *runner) requestRate(ctx context.Context, queue string, ids []string) (rate float64, missed int64, err error) {
	inbox := nats.NewInbox()
	var (
		stored, refused, timedOut atomic.Int64
		sent                      [natsInFlight]atomic.Int64 // unix ns a slot's request went out; 0 when free
	)
	free := make(chan int, natsInFlight)
	for k := range natsInFlight {
		free <- k
	}
	release := func(k int, at int64) bool {
		if sent[k].CompareAndSwap(at, 0) {
			free <- k
			return true
		}
		return false
	}
	sub, err := r.e.nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		k, err := strconv.Atoi(m.Subject[len(inbox)+1:])
		if err != nil || k < 0 || k >= natsInFlight {
			return
		}
		at := sent[k].Load()
		if at == 0 || !release(k, at) {
			return // answered after its timeout gave the slot back
		}
		if bytes.Contains(m.Data, []byte(`"stored"`)) {
			stored.Add(1)
		} else {
			refused.Add(1)
		}
	})
	if err != nil {
		return 0, 0, err
	}
	defer sub.Unsubscribe()
	sub.SetPendingLimits(-1, -1)
	bodies := make([][]byte, len(ids))
	for j, id := range ids {
		bodies[j], _ = json.Marshal(timer.Request{ID: id, After: json.RawMessage(`"10m"`)})
	}
	pctx, stop := context.WithCancel(ctx)
	var pw sync.WaitGroup
	pw.Go(func() {
		for j := 0; pctx.Err() == nil; j++ {
			var k int
			select {
			case k = <-free:
			case <-pctx.Done():
				return
			}
			sent[k].Store(time.Now().UnixNano())
			_ = r.e.nc.PublishRequest("sigwatch.timers.reset."+queue, inbox+"."+strconv.Itoa(k), bodies[j%len(bodies)])
		}
	})
	pw.Go(func() {
		t := time.NewTicker(requestTimeout / 4)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			old := time.Now().Add(-requestTimeout).UnixNano()
			for k := range sent {
				if at := sent[k].Load(); at != 0 && at < old && release(k, at) {
					timedOut.Add(1)
				}
			}
		}
	})
	time.Sleep(time.Second) // warm-up
	s0, t0 := stored.Load(), time.Now()
	time.Sleep(r.prof.PeerFor)
	rate = float64(stored.Load()-s0) / time.Since(t0).Seconds()
	stop()
	pw.Wait()
	// A request still unanswered stores its reset later, over a deadline
	// the lateness sets; an answer comes once the reset is stored.
	busy := func() int {
		n := 0
		for k := range sent {
			if sent[k].Load() != 0 {
				n++
			}
		}
		return n
	}
	waitFor(ctx, requestTimeout, func() bool { return busy() == 0 })
	missed = refused.Load() + timedOut.Load() + int64(busy())
	r.p.Printf("timers", "sigwatch: %.0f resets/s, one per request answered once stored (%d refused, %d unanswered within %v)",
		rate, refused.Load(), timedOut.Load()+int64(busy()), requestTimeout)
	return rate, missed, ctx.Err()
}

// requestTimeout is how long a reset request waits for its answer before
// its slot is given back.
const requestTimeout = 5 * time.Second

// settle waits until the count of stored resets has stood still for two
// seconds, for up to two minutes, and says in the progress what was stored
// meanwhile.
func (r *runner) settle(ctx context.Context, stored func() float64, what string) error {
	start, first := time.Now(), stored()
	last, since := first, start
	ok := waitFor(ctx, 2*time.Minute, func() bool {
		if c := stored(); c != last {
			last, since = c, time.Now()
		}
		return time.Since(since) >= 2*time.Second
	})
	if !ok {
		return fmt.Errorf("resets (%s) still being stored 2 minutes after the measurement", what)
	}
	if last > first {
		r.p.Printf("timers", "sigwatch: %.0f resets (%s) stored after the measurement, over %s", last-first, what,
			since.Sub(start).Round(10*time.Millisecond))
	}
	return nil
}
