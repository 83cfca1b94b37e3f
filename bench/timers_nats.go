package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsTimers runs the NATS-native timer once with n timers: it loads them
// into a new stream, then measures resets and lateness.
func (r *runner) natsTimers(ctx context.Context, n int) (timerRun, error) {
	var out timerRun
	js, err := jetstream.New(r.e.nc, jetstream.WithPublishAsyncMaxPending(natsInFlight))
	if err != nil {
		return out, err
	}
	const name = "NTIMERS"
	_ = js.DeleteStream(ctx, name)
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

	// Memory: the server's live heap, from the empty stream to the loaded
	// one, as Redis's used_memory is sigwatch's.
	pid := r.e.nats.pid()
	heap0, err := r.e.nats.heap(ctx)
	if err != nil {
		return out, err
	}
	rss0 := rssOf(pid)
	if _, err := publish(all, func(int) string { return "600s" }); err != nil {
		return out, err
	}
	heap1, err := r.e.nats.heap(ctx)
	if err != nil {
		return out, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return out, err
	}
	out.bytes = float64(heap1-heap0) / float64(n)
	out.rssBytes = float64(rssOf(pid)-rss0) / float64(n)
	out.streamBytes = float64(info.State.Bytes) / float64(n)
	if info.State.Msgs != uint64(n) {
		return out, fmt.Errorf("the stream holds %d messages, not %d timers", info.State.Msgs, n)
	}

	// Resets: the same timers again, round-robin; and the same in fast
	// batches, its best publishing where it helps.
	cpu := r.newCPUMeter(ctx, nil)
	c0 := cpu.sample()
	if out.resets, err = publish(all, func(int) string { return "600s" }); err != nil {
		return out, err
	}
	out.cpu = cpu.since(c0)
	start := time.Now()
	err = publishFast(ctx, r.e.nc, n, func(j int) *nats.Msg {
		return &nats.Msg{Subject: subj(j), Header: nats.Header{"Nats-TTL": []string{"600s"}}, Data: []byte("1")}
	})
	if err != nil {
		return out, fmt.Errorf("fast batch resets: %w", err)
	}
	out.fastResets = float64(n) / time.Since(start).Seconds()
	r.p.Printf("timers", "NATS-native: %.0f resets/s (fast batches %.0f/s); %.0f B of live heap per timer (stream %.0f B, RSS %.0f B)",
		out.resets, out.fastResets, out.bytes, out.streamBytes, out.rssBytes)

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
