package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/timer"
)

// journalRun is what one run of the timer journal scenario measured.
type journalRun struct {
	nats   float64 // resets/s over the NATS stream, timersBatch per message
	direct float64 // resets/s stored in batches of timersBatch (the HTTP batch path)
	// redis and journal are bytes per timer: Redis's used_memory growth,
	// and the journal stream's bytes.
	redis, journal float64
}

// timerJournal is scenario 12: what durable timers cost. sigwatch's
// generic timers with the journal (timers.queues.<name>.durable, the
// default) and without, against the NATS-native timer, in the same run:
// resets/s over NATS and in batches, and bytes per timer.
func (r *runner) timerJournal(ctx context.Context) error {
	sc := Scenario{ID: 12, Name: "timerjournal", Title: "Durable generic timers: the journal's cost"}
	n := r.prof.TimerCounts[0]
	var on, off []journalRun
	var native, heaps []float64
	err := alternate(rounds,
		func(round int) error {
			r.p.Printf("timerjournal", "%d timers, round %d of %d: journal on", n, round+1, rounds)
			j, err := r.journalRun(ctx, n, true)
			on = append(on, j)
			return err
		},
		func(round int) error {
			r.p.Printf("timerjournal", "%d timers, round %d of %d: journal off", n, round+1, rounds)
			j, err := r.journalRun(ctx, n, false)
			off = append(off, j)
			return err
		},
		func(round int) error {
			r.p.Printf("timerjournal", "%d timers, round %d of %d: NATS-native", n, round+1, rounds)
			rate, heap, err := r.nativeResets(ctx, n)
			native, heaps = append(native, rate), append(heaps, heap)
			return err
		})
	if err != nil {
		return err
	}
	best := func(rs []journalRun, of func(journalRun) float64) float64 {
		b := 0.0
		for _, j := range rs {
			b = max(b, of(j))
		}
		return b
	}
	viaNATS := func(j journalRun) float64 { return j.nats }
	direct := func(j journalRun) float64 { return j.direct }
	size := groupThousands(int64(n))
	nat := 0.0
	for _, v := range native {
		nat = max(nat, v)
	}
	slices.Sort(heaps)
	nativeHeap := heaps[len(heaps)/2] // the median: a heap reading is noisy
	sc.Figures = append(sc.Figures,
		newFigure("timer resets/s over NATS, journal on, "+size+" timers", "/s", best(on, viaNATS), "journal off", best(off, viaNATS)),
		newFigure("timer resets/s in batches of "+strconv.Itoa(timersBatch)+", journal on, "+size+" timers", "/s", best(on, direct), "journal off", best(off, direct)),
		newFigure("timer resets/s over NATS, journal on, "+size+" timers", "/s", best(on, viaNATS), "NATS-native timer, asynchronous publishes", nat),
		newFigure("timer resets/s over NATS, journal off, "+size+" timers", "/s", best(off, viaNATS), "NATS-native timer, asynchronous publishes", nat),
		newFigure("journal bytes per timer (stream)", "B", on[len(on)-1].journal, "NATS-native timer, live heap per timer (median)", nativeHeap),
		newFigure("Redis bytes per timer, journal on", "B", on[len(on)-1].redis, "journal off", off[len(off)-1].redis),
	)
	sc.Notes = append(sc.Notes, "Each side's best of "+strconv.Itoa(rounds)+" runs, the order alternated. sigwatch runs its timer "+
		"service in the harness process with one queue; with the journal on, every reset is journalled (one message per timer in a "+
		"file-backed stream keeping one message per timer, sent in fast batches of 1,000, up to 8 in flight per batch of resets) "+
		"before it is acknowledged. Over NATS, one store is up to timers.fetch (256) messages of "+strconv.Itoa(timersBatch)+" resets. The NATS-native "+
		"timer is scenario 9's: a memory stream with one message per subject and per-message TTL, one asynchronous publish per reset.")
	r.res.add(sc)
	return nil
}

// journalRun loads n timers into sigwatch's timer service, with the journal
// or without, and measures resets.
func (r *runner) journalRun(ctx context.Context, n int, journal bool) (journalRun, error) {
	var out journalRun
	if err := r.e.flush(ctx); err != nil {
		return out, err
	}
	pub, err := dispatch.New(ctx, r.e.nc, dispatch.Options{})
	if err != nil {
		return out, err
	}
	defer pub.Close()
	js, err := jetstream.New(r.e.nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		return out, err
	}
	_ = js.DeleteStream(ctx, pub.TimerJournalStream())
	var j *dispatch.TimerJournal
	if journal {
		if j, err = pub.OpenTimerJournal(ctx); err != nil {
			return out, err
		}
	}
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	topo, err := shard.NewWatcher(ctx, store, shards, 500*time.Millisecond, nil)
	if err != nil {
		return out, err
	}
	reg := prometheus.NewRegistry()
	svc, err := timer.New(timer.Options{Replica: fmt.Sprintf("bench-%d", time.Now().UnixNano()), Config: timer.Config{NATS: true},
		Consume: true, Journal: j}, store, topo, pub, reg, nil)
	if err != nil {
		return out, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { topo.Run(rctx) })
	wg.Go(func() { _ = svc.Run(rctx) })

	const queue = "bench"
	ids := deviceIDs(n)
	far := time.Now().Add(10 * time.Minute).UnixMilli()
	batches := func(deadline int64) (float64, error) {
		start := time.Now()
		err := parallelChunks(ctx, n, timersBatch, 8, func(lo, hi int) error {
			rs := make([]shard.TimerReset, 0, hi-lo)
			for _, id := range ids[lo:hi] {
				rs = append(rs, shard.TimerReset{Member: shard.TimerMember(queue, id), Deadline: deadline})
			}
			return svc.Reset(ctx, rs)
		})
		return float64(n) / time.Since(start).Seconds(), err
	}
	m0, err := r.e.usedMemory(ctx)
	if err != nil {
		return out, err
	}
	if _, err := batches(far); err != nil {
		return out, err
	}
	m1, err := r.e.usedMemory(ctx)
	if err != nil {
		return out, err
	}
	out.redis = float64(m1-m0) / float64(n)
	if journal {
		if s, err := js.Stream(ctx, pub.TimerJournalStream()); err == nil {
			out.journal = float64(s.CachedInfo().State.Bytes) / float64(n)
		}
	}
	if out.direct, err = batches(far + 1000); err != nil {
		return out, err
	}

	// Over NATS: publishers keep a backlog in the reset stream; the rate is
	// what the service stored (journalled, then acknowledged) per second.
	var bodies [][]byte
	for lo := 0; lo < n; lo += timersBatch {
		batch := make([]timer.Request, 0, timersBatch)
		for _, id := range ids[lo:min(lo+timersBatch, n)] {
			batch = append(batch, timer.Request{ID: id, After: json.RawMessage(`"10m"`)})
		}
		data, _ := json.Marshal(batch)
		bodies = append(bodies, data)
	}
	// The rate is the time to store (journal, then acknowledge) twice the
	// timers from when their messages start to go out: a store is up to
	// timers.fetch messages, counted when whole, too lumpy for a window.
	stored := func() float64 { return counterValue(reg, "sigwatch_timers_resets_total") }
	s0, t0 := stored(), time.Now()
	for range 2 {
		for _, b := range bodies {
			if err := publishAsync(ctx, js, &nats.Msg{Subject: "sigwatch.timers.set." + queue, Data: b}); err != nil {
				return out, err
			}
		}
	}
	want := s0 + float64(2*n)
	if !waitFor(ctx, 3*time.Minute, func() bool { return stored() >= want }) {
		return out, fmt.Errorf("%.0f of %d resets published over NATS stored after 3 minutes", stored()-s0, 2*n)
	}
	out.nats = float64(2*n) / time.Since(t0).Seconds()
	r.p.Printf("timerjournal", "journal %v: %.0f resets/s over NATS, %.0f/s in batches; %.0f B per timer in Redis, %.0f B in the journal",
		journal, out.nats, out.direct, out.redis, out.journal)
	return out, nil
}

// nativeResets loads n NATS-native timers and resets each once with
// asynchronous publishes; it returns the resets/s and the server's live
// heap per timer.
func (r *runner) nativeResets(ctx context.Context, n int) (rate, heap float64, err error) {
	js, err := jetstream.New(r.e.nc, jetstream.WithPublishAsyncMaxPending(natsInFlight))
	if err != nil {
		return 0, 0, err
	}
	const name = "NJTIMERS"
	_ = js.DeleteStream(ctx, name)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"njt.>"}, Storage: jetstream.MemoryStorage,
		MaxMsgsPerSubject: 1, AllowMsgTTL: true, SubjectDeleteMarkerTTL: time.Second}); err != nil {
		return 0, 0, err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), name)
	publish := func() (float64, error) {
		start := time.Now()
		for j := range n {
			m := &nats.Msg{Subject: "njt." + strconv.Itoa(j), Header: nats.Header{"Nats-TTL": []string{"600s"}}, Data: []byte("1")}
			if err := publishAsync(ctx, js, m); err != nil {
				return 0, err
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}
	h0, err := r.e.nats.heap(ctx)
	if err != nil {
		return 0, 0, err
	}
	if _, err := publish(); err != nil {
		return 0, 0, err
	}
	h1, err := r.e.nats.heap(ctx)
	if err != nil {
		return 0, 0, err
	}
	rate, err = publish()
	r.p.Printf("timerjournal", "NATS-native: %.0f resets/s, %.0f B of live heap per timer", rate, float64(h1-h0)/float64(n))
	return rate, float64(h1-h0) / float64(n), err
}
