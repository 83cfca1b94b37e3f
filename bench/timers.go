package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// timersBatch is how many resets one NATS message carries on sigwatch's
// path.
const timersBatch = 500

// timers is scenario 9: sigwatch's generic timers against the NATS-native
// resettable timer (a stream with one message per subject, per-message TTL
// and subject delete markers: each reset is one publish with Nats-TTL, and
// the marker is the fire), side by side: resets/s, memory per timer, and
// fire lateness with 20k timers due spread over the lag window and 100k
// due at once.
func (r *runner) timers(ctx context.Context) error {
	sc := Scenario{ID: 9, Name: "timers", Title: "Generic timers vs the NATS-native timer",
		Baselines: []string{"NATS-native timer (nats-server " + r.versionOf("nats-server") + "): a memory-storage stream " +
			"with `MaxMsgsPerSubject=1`, `AllowMsgTTL` and `SubjectDeleteMarkerTTL`; a timer is a subject, a reset is " +
			"one JetStream publish with a `Nats-TTL` header (whole seconds, at least 1 s), acknowledged by the " +
			"server; the fire is the delete marker the server stores when the TTL runs out, read by a JetStream " +
			"ordered consumer. Lateness is the marker's arrival minus the reset's publish time plus its TTL."}}
	for _, n := range r.prof.TimerCounts {
		size := groupThousands(int64(n))
		nat, err := r.natsTimers(ctx, n)
		if err != nil {
			return fmt.Errorf("NATS-native, %d timers: %w", n, err)
		}
		sw, err := r.sigwatchTimers(ctx, n, nat)
		if err != nil {
			return fmt.Errorf("sigwatch, %d timers: %w", n, err)
		}
		// The NATS-native timer with its best publishing: asynchronous
		// publishes, or fast batches where they are faster.
		best, how := nat.resets, "asynchronous publishes"
		if nat.fastResets > best {
			best, how = nat.fastResets, "fast batches"
		}
		f := newFigure(fmt.Sprintf("timer resets/s, %s timers", size), "/s", sw.resets, "NATS-native timer, best publishing", best, ratioAtLeast(3))
		f.Detail = fmt.Sprintf("sigwatch: resets published over NATS (`sigwatch.timers.set.<queue>`), %d per message, "+
			"stored in Redis and then acknowledged, counted as stored; backlog left %d messages; %s. NATS-native, its best "+
			"publishing (%s): one acknowledged publish per reset, %d in flight, %.0f/s (%s); fast batches of %d "+
			"(nats-server 2.14+, one acknowledgement per 100 and one per batch), %.0f/s",
			timersBatch, sw.backlog, sw.cpu, how, natsInFlight, nat.resets, nat.cpu, atomicBatch, nat.fastResets)
		// One reset per message on both sides: the NATS-native timer's
		// acknowledged publish per reset.
		single := newFigure(fmt.Sprintf("timer resets/s, one reset per NATS message (diagnostic), %s timers", size), "/s",
			sw.single, "NATS-native timer, one publish per reset", nat.resets)
		single.Detail = "the same path with a message per reset: its ceiling is the JetStream publish rate the NATS-native timer has, plus sigwatch's store"
		req := newFigure(fmt.Sprintf("timer resets/s, one reset per request answered once stored, %s timers", size), "/s",
			sw.requested, "NATS-native timer, one publish per reset", nat.resets, ratioAtLeast(1))
		req.Detail = fmt.Sprintf("sigwatch: one core NATS request per reset on `sigwatch.timers.reset.<queue>`, answered once "+
			"the reset is stored in Redis, %d requests in flight (as many as the NATS-native timer's publishes); %s",
			natsInFlight, sw.requestCPU)
		mem := newFigure(fmt.Sprintf("memory per timer, %s timers", size), "B", sw.bytes, "NATS-native timer", nat.streamBytes, ratioAtMost(0.5))
		mem.Detail = fmt.Sprintf("each store's own accounting: sigwatch, Redis used_memory growth / timers, a timer without "+
			"payload (member `<queue>/<id>`); NATS-native, the stream's bytes / timers (its messages only, not the server's "+
			"indexes; nats-server RSS grew by %.0f B per timer, which GC headroom makes noisy)", nat.bytes)
		sc.Figures = append(sc.Figures, f, single, req, mem)
		for _, l := range []struct {
			what   string
			sw, nt lagStats
		}{{fmt.Sprintf("%s due over %s", groupThousands(int64(r.prof.LagFires)), r.prof.LagWindow), sw.spread, nat.spread},
			{fmt.Sprintf("%s due at once", groupThousands(int64(r.prof.Burst))), sw.once, nat.once}} {
			target := ratioAtMost(0.1)
			if l.what == fmt.Sprintf("%s due at once", groupThousands(int64(r.prof.Burst))) {
				target = ratioAtMost(0.8)
			}
			p99 := newFigure(fmt.Sprintf("timer lateness p99, %s timers, %s", size, l.what), "ms", l.sw.P99, "NATS-native timer", l.nt.P99, target)
			p99.Detail = fmt.Sprintf("sigwatch %s; NATS-native %s", l.sw, l.nt)
			if l.what == fmt.Sprintf("%s due at once", groupThousands(int64(r.prof.Burst))) {
				p99.Detail += fmt.Sprintf(" (from arming them to the last fire: sigwatch %s; NATS-native %s)", sw.onceCPU, nat.onceCPU)
			}
			sc.Figures = append(sc.Figures, p99,
				newFigure(fmt.Sprintf("timer lateness p50, %s timers, %s", size, l.what), "ms", l.sw.P50, "NATS-native timer", l.nt.P50))
			if l.sw.Min < 0 {
				sc.Notes = append(sc.Notes, fmt.Sprintf("%s timers, %s: some timer events arrived before their deadline "+
					"(earliest %.1f ms early): no early fire is broken at this commit.", size, l.what, -l.sw.Min))
			}
		}
	}
	sc.Notes = append(sc.Notes, "sigwatch runs its timer service in the harness process (one replica owning all "+
		strconv.Itoa(shards)+" shards, firing through the same JetStream publisher as the lost events, storing NATS resets with "+
		"its consumer); lateness is the event's arrival through an ordered JetStream consumer of the event stream (so once "+
		"stored, as the NATS-native side's markers are read) minus its deadline. The other timers "+
		"of each count stay 10 minutes ahead, and both systems hold the same count. The NATS-native timer's deadlines "+
		"have whole-second TTLs counted from each publish, so the spread ones fall due in one-second steps and the ones "+
		"\"due at once\" over the time their publishing took; sigwatch's deadlines are set the same distances apart "+
		"(the NATS-native side runs first and its deadlines are recorded).")
	r.res.add(sc)
	return nil
}

// natsInFlight bounds the NATS-native timer's unacknowledged publishes.
const natsInFlight = 4096

// timerRun is what one system measured.
type timerRun struct {
	resets, single float64 // resets/s
	fastResets     float64 // resets/s in fast batches (the NATS-native timer)
	requested      float64 // resets/s, one per request answered once stored
	requestCPU     cpuShares
	bytes          float64 // per timer
	streamBytes    float64
	spread, once   lagStats
	backlog        uint64
	cpu, onceCPU   cpuShares
	// spreadAt and onceAt are the NATS-native side's deadlines, in ms
	// after its first, for its timers in order: the sigwatch side sets its
	// deadlines the same distance apart.
	spreadAt, onceAt []int64
}

// natsTimers measures the NATS-native timer with n timers.
func (r *runner) natsTimers(ctx context.Context, n int) (timerRun, error) {
	var out timerRun
	js, err := jetstream.New(r.e.nc, jetstream.WithPublishAsyncMaxPending(natsInFlight))
	if err != nil {
		return out, err
	}
	const name = "NTIMERS"
	_ = js.DeleteStream(ctx, name)
	rss0 := rssOf(r.e.nats.pid())
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"nt.>"}, Storage: jetstream.MemoryStorage,
		MaxMsgsPerSubject: 1, AllowMsgTTL: true, SubjectDeleteMarkerTTL: time.Second, AllowBatchPublish: true})
	if err != nil {
		return out, err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), name)
	subj := func(j int) string { return "nt." + strconv.Itoa(j) }
	publish := func(ids []int, ttl func(j int) string) (float64, error) {
		start := time.Now()
		for _, j := range ids {
			m := &nats.Msg{Subject: subj(j), Header: nats.Header{"Nats-TTL": []string{ttl(j)}}, Data: []byte("1")}
			if err := publishAsync(ctx, js, m); err != nil {
				return 0, err
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return float64(len(ids)) / time.Since(start).Seconds(), nil
	}
	all := make([]int, n)
	for j := range all {
		all[j] = j
	}
	r.p.Printf("timers", "NATS-native: %d timers", n)
	if _, err := publish(all, func(int) string { return "600s" }); err != nil {
		return out, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return out, err
	}
	out.streamBytes = float64(info.State.Bytes) / float64(n)
	out.bytes = float64(rssOf(r.e.nats.pid())-rss0) / float64(n)
	// Resets: the same timers again, round-robin, best of two; and the
	// same in fast batches, its best publishing where it helps.
	cpu := r.newCPUMeter(ctx, nil)
	c0 := cpu.sample()
	for range 2 {
		rate, err := publish(all, func(int) string { return "600s" })
		if err != nil {
			return out, err
		}
		out.resets = max(out.resets, rate)
	}
	out.cpu = cpu.since(c0)
	for range 2 {
		start := time.Now()
		err := publishFast(ctx, r.e.nc, n, func(j int) *nats.Msg {
			return &nats.Msg{Subject: subj(j), Header: nats.Header{"Nats-TTL": []string{"600s"}}, Data: []byte("1")}
		})
		if err != nil {
			return out, fmt.Errorf("fast batch resets: %w", err)
		}
		out.fastResets = max(out.fastResets, float64(n)/time.Since(start).Seconds())
	}
	r.p.Printf("timers", "NATS-native: %.0f resets/s, %.0f B per timer (stream %.0f B)", out.resets, out.bytes, out.streamBytes)

	// Lateness: the fires are the markers.
	var (
		mu       sync.Mutex
		deadline = map[string]time.Time{}
		lags     []float64
	)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"nt.>"}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return out, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if m.Headers().Get("Nats-Marker-Reason") == "" {
			return
		}
		now := time.Now()
		mu.Lock()
		if d, ok := deadline[m.Subject()]; ok {
			lags = append(lags, float64(now.Sub(d).Microseconds())/1e3)
			delete(deadline, m.Subject())
		}
		mu.Unlock()
	})
	if err != nil {
		return out, err
	}
	defer cc.Stop()
	measure := func(ids []int, ttl func(j int) time.Duration, at *[]int64) (lagStats, error) {
		mu.Lock()
		lags = nil
		mu.Unlock()
		var first time.Time
		for k, j := range ids {
			d := ttl(j)
			due := time.Now().Add(d)
			if k == 0 {
				first = due
			}
			*at = append(*at, due.Sub(first).Milliseconds())
			mu.Lock()
			deadline[subj(j)] = due
			mu.Unlock()
			m := &nats.Msg{Subject: subj(j), Header: nats.Header{"Nats-TTL": []string{d.String()}}, Data: []byte("1")}
			if err := publishAsync(ctx, js, m); err != nil {
				return lagStats{}, err
			}
		}
		<-js.PublishAsyncComplete()
		longest := time.Duration(0)
		for _, j := range ids {
			longest = max(longest, ttl(j))
		}
		waitFor(ctx, longest+30*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(lags) >= len(ids)
		})
		mu.Lock()
		defer mu.Unlock()
		if len(lags) < len(ids) {
			return lagStats{}, fmt.Errorf("%d of %d markers arrived", len(lags), len(ids))
		}
		return summarize(lags), nil
	}
	steps := int(r.prof.LagWindow / time.Second)
	spread := all[:r.prof.LagFires]
	if out.spread, err = measure(spread, func(j int) time.Duration { return time.Duration(1+j%steps) * time.Second }, &out.spreadAt); err != nil {
		return out, err
	}
	r.p.Printf("timers", "NATS-native: %d due over %s: %s", len(spread), r.prof.LagWindow, out.spread)
	once := all[:min(r.prof.Burst, n)]
	c0 = cpu.sample()
	if out.once, err = measure(once, func(int) time.Duration { return 5 * time.Second }, &out.onceAt); err != nil {
		return out, err
	}
	out.onceCPU = cpu.since(c0)
	r.p.Printf("timers", "NATS-native: %d due at once: %s", len(once), out.once)
	return out, nil
}

// sigwatchTimers measures sigwatch's generic timers with n timers.
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
	rc, err := newRedisClient(r.e.redis.Addr)
	if err != nil {
		return out, err
	}
	defer rc.Close()
	reg := prometheus.NewRegistry()
	svc, err := timer.New(timer.Options{Replica: fmt.Sprintf("bench-%d", time.Now().UnixNano()), Fire: true, NATS: true,
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
	if out.requested, err = r.requestRate(ctx, queue, ids); err != nil {
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
			return lagStats{}, fmt.Errorf("%d of %d timer events arrived", len(lags), k)
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

// rssOf is the resident memory of process pid in bytes (0 if unknown).
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// requestRate measures resets sent one per core NATS request, each
// answered once stored, with natsInFlight requests in flight: the rate of
// answers that say stored, over the profile's peer window.
func (r *runner) requestRate(ctx context.Context, queue string, ids []string) (float64, error) {
	inbox := nats.NewInbox()
	var stored, refused atomic.Int64
	room := make(chan struct{}, natsInFlight)
	sub, err := r.e.nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		if bytes.Contains(m.Data, []byte(`"stored"`)) {
			stored.Add(1)
		} else {
			refused.Add(1)
		}
		<-room
	})
	if err != nil {
		return 0, err
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
			select {
			case room <- struct{}{}:
			case <-pctx.Done():
				return
			}
			_ = r.e.nc.PublishRequest("sigwatch.timers.reset."+queue, inbox+"."+strconv.Itoa(j%natsInFlight), bodies[j%len(bodies)])
		}
	})
	time.Sleep(time.Second) // warm-up
	s0, t0 := stored.Load(), time.Now()
	time.Sleep(r.prof.PeerFor)
	rate := float64(stored.Load()-s0) / time.Since(t0).Seconds()
	stop()
	pw.Wait()
	if n := refused.Load(); n > 0 {
		return 0, fmt.Errorf("%d reset requests refused", n)
	}
	r.p.Printf("timers", "sigwatch: %.0f resets/s, one per request answered once stored", rate)
	return rate, nil
}
