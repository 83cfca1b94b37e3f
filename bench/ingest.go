package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/shard"
)

// loadgen is the harness's handle on a load generator child.
type loadgen struct {
	c                   *child
	sent, acked, failed atomic.Int64
	finished            chan struct{} // closed when the child printed its final counts
	lines               sync.WaitGroup
}

// startLoadgen starts a load generator publishing to broker at rate 0.
func (r *runner) startLoadgen(broker string, devices int) (*loadgen, error) {
	cfg := loadgenConfig{Broker: broker, ClientID: fmt.Sprintf("bench-pub-%d", time.Now().UnixNano()),
		Clients: 4, Devices: devices, QoS: 1, Window: 2048}
	c, err := startChild(r.e.dir, "loadgen", cfg)
	if err != nil {
		return nil, err
	}
	lg := &loadgen{c: c, finished: make(chan struct{})}
	lg.lines.Go(func() {
		c.readLines(func(line string) {
			final := strings.HasPrefix(line, "done ")
			f := strings.Fields(strings.TrimPrefix(line, "done "))
			if len(f) != 3 {
				return
			}
			s, _ := strconv.ParseInt(f[0], 10, 64)
			a, _ := strconv.ParseInt(f[1], 10, 64)
			x, _ := strconv.ParseInt(f[2], 10, 64)
			lg.sent.Store(s)
			lg.acked.Store(a)
			lg.failed.Store(x)
			if final {
				close(lg.finished)
			}
		})
	})
	return lg, nil
}

func (lg *loadgen) setRate(rate float64) { lg.c.send("rate %.0f", rate) }

// stop stops publishing, waits for the acks of what was published and for
// the child to exit.
func (lg *loadgen) stop() {
	lg.c.send("stop")
	select {
	case <-lg.finished:
	case <-time.After(30 * time.Second):
	}
	lg.c.stop(10 * time.Second)
	lg.lines.Wait()
}

// rampStep is one rate held for a step of the ramp.
type rampStep struct {
	Offered   float64   `json:"offered"`   // signals/s asked of the publisher
	Published float64   `json:"published"` // acked by the broker, /s
	Delivered float64   `json:"delivered"` // stored (sigwatch) or received (raw), /s
	Backlog   int64     `json:"backlog"`   // acked but not yet delivered at the end
	CPUus     float64   `json:"cpu_us"`    // this process's CPU per delivered signal
	OK        bool      `json:"ok"`
	Shares    cpuShares `json:"cpu_shares"`
}

// rampResult is the outcome of one ramp.
type rampResult struct {
	Capacity  float64 // highest delivered rate of a step that kept up
	Best      rampStep
	Steps     []rampStep
	Acked     int64
	Delivered int64
	Lost      int64
	Dups      int64
	Warnings  string // what sigwatch logged at warning level, if anything
}

// ramp raises the paced publishing rate step by step while the receiving
// side keeps up (delivered ≥ 95% of offered, with a bounded backlog), then
// refines between the last rate that kept up and the first that did not.
// Publishers are paced: an unpaced generator measures loss, not capacity.
func (r *runner) ramp(ctx context.Context, what string, lg *loadgen, delivered func() int64, meter *cpuMeter) (rampResult, error) {
	var res rampResult
	step := func(rate float64) rampStep {
		lg.setRate(rate)
		a0, d0, s0, c0, t0 := lg.acked.Load(), delivered(), meter.sample(), processCPU(), time.Now()
		select {
		case <-time.After(r.prof.Step):
		case <-ctx.Done():
		}
		el := time.Since(t0).Seconds()
		a1, d1 := lg.acked.Load(), delivered()
		st := rampStep{Offered: rate, Published: float64(a1-a0) / el, Delivered: float64(d1-d0) / el,
			Backlog: a1 - d1, Shares: meter.since(s0)}
		if d1 > d0 {
			st.CPUus = float64((processCPU() - c0).Microseconds()) / float64(d1-d0)
		}
		st.OK = st.Published >= 0.95*rate && st.Delivered >= 0.95*rate && float64(st.Backlog) <= 0.25*rate+2000
		verdict := "kept up"
		if !st.OK {
			verdict = "fell behind"
		}
		r.p.Printf("ingest", "%s: offered %6.0f/s published %6.0f/s delivered %6.0f/s backlog %6d: %s; %s",
			what, rate, st.Published, st.Delivered, st.Backlog, verdict, st.Shares)
		res.Steps = append(res.Steps, st)
		if st.OK && st.Delivered > res.Capacity {
			res.Capacity, res.Best = st.Delivered, st
		}
		return st
	}
	drain := func(timeout time.Duration) {
		lg.setRate(0)
		last, lastMove := delivered(), time.Now()
		deadline := time.Now().Add(timeout)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			d := delivered()
			if d >= lg.acked.Load() {
				return
			}
			if d != last {
				last, lastMove = d, time.Now()
			} else if time.Since(lastMove) > r.prof.DrainIdle {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A warm-up at the first rate, not judged: connections, subscriptions
	// and the first counts settle.
	lg.setRate(r.prof.RampStart)
	select {
	case <-time.After(500 * time.Millisecond):
	case <-ctx.Done():
	}
	// Up by RampFactor while the receiver keeps up; if it cannot keep up
	// with the first rate, down by half until it does.
	lo, hi := 0.0, 0.0
	rate := r.prof.RampStart
	for ctx.Err() == nil {
		if step(rate).OK {
			lo = rate
			if hi > 0 || rate*r.prof.RampFactor > 1_000_000 {
				break
			}
			rate *= r.prof.RampFactor
			continue
		}
		hi = rate
		if lo > 0 || rate < 2000 {
			break
		}
		drain(15 * time.Second)
		rate /= 2
	}
	for k := 0; k < r.prof.Bisect && hi > 0 && lo > 0 && ctx.Err() == nil; k++ {
		drain(15 * time.Second)
		mid := (lo + hi) / 2
		if step(mid).OK {
			lo = mid
		} else {
			hi = mid
		}
	}
	lg.stop()
	drain(r.prof.DrainIdle + 30*time.Second)
	res.Acked, res.Delivered = lg.acked.Load(), delivered()
	if res.Delivered < res.Acked {
		res.Lost = res.Acked - res.Delivered
	} else {
		res.Dups = res.Delivered - res.Acked
	}
	r.p.Printf("ingest", "%s: capacity %.0f/s at %.2f µs CPU per signal in this process; %d of %d acked signals lost, %d duplicates",
		what, res.Capacity, res.Best.CPUus, res.Lost, res.Acked, res.Dups)
	if res.Capacity == 0 {
		return res, fmt.Errorf("%s: did not keep up even at %.0f/s", what, r.prof.RampStart)
	}
	return res, ctx.Err()
}

// ingest is scenario 1: MQTT QoS 1 → sigwatch ingest → Redis (acked after
// the deadline is stored), against the raw broker pass-through (the same
// publisher to a plain paho subscriber at the same QoS), on Mosquitto and on
// the nats-server MQTT listener. Raw and sigwatch ramps alternate, for
// rounds rounds; each side keeps its best.
func (r *runner) ingest(ctx context.Context) error {
	sc := Scenario{ID: 1, Name: "ingest", Title: "Ingest end to end over MQTT QoS 1",
		Baselines: []string{"raw broker pass-through: the same paced publisher (a child process, 4 MQTT connections, QoS 1, " +
			"empty payloads) to one plain paho subscriber with a persistent session at QoS 1 that only counts messages " +
			"(paho acks each on receipt), ramped the same way, on the same broker."}}
	// The raw subscriber speaks MQTT 3.1.1 in every row; the third row has
	// ingest subscribe over MQTT 5 (mqtt.protocol: 5).
	brokers := []struct{ name, url, protocol string }{
		{"Mosquitto", r.e.mosq.URL, ingest.Protocol311},
		{"NATS MQTT", r.e.ni.MQTTURL, ingest.Protocol311},
		{"Mosquitto, ingest on MQTT 5", r.e.mosq.URL, ingest.Protocol5},
	}
	for _, b := range brokers {
		var raws, sws []rampResult
		err := alternate(rounds, func(int) error {
			raw, err := r.ingestRaw(ctx, b.name, b.url)
			raws = append(raws, raw)
			return err
		}, func(round int) error {
			sw, err := r.ingestSigwatch(ctx, b.name, b.url, b.protocol, b.name == "Mosquitto" && round == 0)
			sws = append(sws, sw)
			return err
		})
		if err != nil {
			return err
		}
		raw, sw := bestRamp(raws), bestRamp(sws)
		for _, x := range sws {
			if x.Warnings != "" {
				sc.Notes = append(sc.Notes, x.Warnings+".")
			}
		}
		f := newFigure("ingest signals/s, QoS 1 via "+b.name, "/s", sw.Capacity, "raw pass-through", raw.Capacity, ratioAtLeast(0.8))
		f.Detail = fmt.Sprintf("highest paced rate kept up with, %s (sigwatch %s; raw %s); at it, sigwatch: %s; raw: %s",
			bestOf(len(sws)), runs(capacities(sws), "/s"), runs(capacities(raws), "/s"), sw.Best.Shares, raw.Best.Shares)
		sc.Figures = append(sc.Figures, f)
		if rate, swCPU, rawCPU, ok := cpuAtCommonRate(sws, raws); ok {
			cpu := newFigure("CPU per signal in the receiving process, "+b.name, "µs", swCPU, "paho subscriber", rawCPU)
			cpu.Detail = fmt.Sprintf("at %.0f signals/s, the highest rate both kept up with: sigwatch's ingest (parse, "+
				"batch, Redis write, ack) against a subscriber that only counts; getrusage over the step", rate)
			sc.Figures = append(sc.Figures, cpu)
		}
		var lost, acked, rawLost, rawAcked, dups, rawDups int64
		for _, x := range sws {
			lost, acked, dups = lost+x.Lost, acked+x.Acked, dups+x.Dups
		}
		for _, x := range raws {
			rawLost, rawAcked, rawDups = rawLost+x.Lost, rawAcked+x.Acked, rawDups+x.Dups
		}
		sc.Figures = append(sc.Figures, Figure{Name: "acked signals lost, " + b.name, Sigwatch: float64(lost),
			BaselineName: "raw pass-through", Baseline: float64(rawLost),
			Detail: fmt.Sprintf("of %d signals the broker acked to the publisher, sigwatch stored all but %d (%d duplicates); "+
				"of %d, the raw subscriber received all but %d (%d duplicates); counted %s after publishing stopped and "+
				"nothing more arrived", acked, lost, dups, rawAcked, rawLost, rawDups, r.prof.DrainIdle)})
	}
	sc.Notes = append(sc.Notes, fmt.Sprintf("After a half-second warm-up, the paced rate starts at %.0f/s and grows %.1f× per %s step while the receiver "+
		"keeps up (delivered ≥ 95%% of offered, backlog ≤ a quarter second of it), then %d refining steps bisect "+
		"between the last rate that kept up and the first that did not. %d devices publish round-robin; sigwatch's "+
		"deadlines and registry hold them all beforehand (steady state).",
		r.prof.RampStart, r.prof.RampFactor, r.prof.Step, r.prof.Bisect, r.prof.IngestDevices))
	r.res.add(sc)
	return nil
}

// bestRamp returns the ramp with the highest capacity.
func bestRamp(rs []rampResult) rampResult {
	var best rampResult
	for _, x := range rs {
		if x.Capacity > best.Capacity {
			best = x
		}
	}
	return best
}

// cpuAtCommonRate finds the highest offered rate that both sides kept up
// with and returns each side's least CPU per signal at it. CPU per signal
// falls as the rate rises (reads and writes carry more per system call), so
// the two sides are compared at the same rate.
func cpuAtCommonRate(a, b []rampResult) (rate, cpuA, cpuB float64, ok bool) {
	okAt := func(rs []rampResult) map[float64]float64 {
		m := map[float64]float64{}
		for _, x := range rs {
			for _, st := range x.Steps {
				if st.OK && st.CPUus > 0 && (m[st.Offered] == 0 || st.CPUus < m[st.Offered]) {
					m[st.Offered] = st.CPUus
				}
			}
		}
		return m
	}
	ma, mb := okAt(a), okAt(b)
	for r, ca := range ma {
		if cb, found := mb[r]; found && r > rate {
			rate, cpuA, cpuB, ok = r, ca, cb, true
		}
	}
	return rate, cpuA, cpuB, ok
}

// capacities lists the rates the ramps kept up with.
func capacities(rs []rampResult) []float64 {
	out := make([]float64, len(rs))
	for j, x := range rs {
		out[j] = x.Capacity
	}
	return out
}

// ingestRaw ramps the raw pass-through on broker.
func (r *runner) ingestRaw(ctx context.Context, name, url string) (rampResult, error) {
	what := "raw " + name
	var got atomic.Int64
	id := fmt.Sprintf("bench-raw-%d", time.Now().UnixNano())
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID(id).
		SetCleanSession(false).SetOrderMatters(false).SetAutoReconnect(true).SetKeepAlive(15 * time.Second).
		SetDefaultPublishHandler(func(mqtt.Client, mqtt.Message) { got.Add(1) })
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return rampResult{}, fmt.Errorf("%s: connect: %v", what, tok.Error())
	}
	// The persistent session goes with the run: left behind, it would
	// queue every later signal on the broker for a subscriber that is gone.
	defer func() {
		c.Disconnect(250)
		if err := clearSession(url, id); err != nil {
			r.p.Printf("ingest", "%s: %v", what, err)
		}
	}()
	if tok := c.Subscribe("devices/+/signal", 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return rampResult{}, fmt.Errorf("%s: subscribe: %v", what, tok.Error())
	}
	lg, err := r.startLoadgen(url, r.prof.IngestDevices)
	if err != nil {
		return rampResult{}, err
	}
	meter := r.newCPUMeter(ctx, map[string]int{"loadgen": lg.c.pid()})
	return r.ramp(ctx, what, lg, got.Load, meter)
}

// ingestSigwatch ramps sigwatch's ingest on broker, taking a CPU profile
// when profile is set.
func (r *runner) ingestSigwatch(ctx context.Context, name, url, protocol string, profile bool) (rampResult, error) {
	what := "sigwatch " + name
	if err := r.e.flush(ctx); err != nil {
		return rampResult{}, err
	}
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	ids := deviceIDs(r.prof.IngestDevices)
	far := time.Now().Add(threshold).UnixMilli()
	if err := preload(ctx, store, ids, func(int) int64 { return far }); err != nil {
		return rampResult{}, err
	}
	if err := preloadRegistry(ctx, store, ids, ""); err != nil {
		return rampResult{}, err
	}
	topo, err := shard.NewWatcher(ctx, store, shards, 500*time.Millisecond, nil)
	if err != nil {
		return rampResult{}, err
	}
	pub, err := dispatch.New(ctx, r.e.nc, dispatch.Options{})
	if err != nil {
		return rampResult{}, err
	}
	reg := prometheus.NewRegistry()
	start := time.Now()
	wl, log := newWarnLog(filepath.Join(r.e.dir, fmt.Sprintf("ingest-%d.log", start.UnixNano())))
	defer wl.close()
	id := fmt.Sprintf("bench-ingest-%d", start.UnixNano())
	// Cleared once ingest has stopped (deferred calls run last in, first out).
	defer func() {
		if err := clearSession(url, id); err != nil {
			r.p.Printf("ingest", "%s: %v", what, err)
		}
	}()
	in, err := ingest.New(ingest.Options{Brokers: []string{url}, ClientID: id, Protocol: protocol,
		Thresholds: shard.NewThresholds(store, threshold, nil)}, store, topo, pub, reg, log)
	if err != nil {
		return rampResult{}, err
	}
	ictx, stopIngest := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { topo.Run(ictx) })
	wg.Go(func() {
		if err := in.Run(ictx); err != nil {
			r.p.Printf("ingest", "%s: ingest stopped: %v", what, err)
		}
	})
	defer func() { stopIngest(); wg.Wait() }()
	// Ingest is subscribed once its watermark moves: the probe it sent
	// after subscribing came back through the broker.
	if !waitFor(ctx, 20*time.Second, func() bool {
		wm, _, err := store.Watermarks().Read(ctx)
		return err == nil && wm >= start.UnixMilli()
	}) {
		return rampResult{}, fmt.Errorf("%s: ingest did not subscribe within 20s", what)
	}
	stored := func() int64 { return int64(counterValue(reg, "sigwatch_ingest_signals_total")) }

	lg, err := r.startLoadgen(url, r.prof.IngestDevices)
	if err != nil {
		return rampResult{}, err
	}
	meter := r.newCPUMeter(ctx, map[string]int{"loadgen": lg.c.pid()})
	stopProf := func() {}
	if profile {
		stopProf = r.cpuProfile("ingest-"+strings.ToLower(strings.ReplaceAll(name, " ", "-")),
			fmt.Sprintf("ingest storing MQTT QoS 1 signals from %s during the whole ramp of scenario 1", name))
	}
	res, err := r.ramp(ctx, what, lg, stored, meter)
	stopProf()
	r.p.Printf("ingest", "%s: mean flush %.1f signals, mean store latency %.2f ms", what,
		histogramMean(reg, "sigwatch_ingest_flush_batch_size"), 1000*histogramMean(reg, "sigwatch_ingest_store_latency_seconds"))
	if n, first := wl.summary(); n > 0 {
		res.Warnings = fmt.Sprintf("ingest logged %d warnings during the ramp on %s, the first: %q", n, name, first)
		r.p.Printf("ingest", "%s: %s", what, res.Warnings)
	}
	return res, err
}

// counterValue returns the value of the counter called name in reg.
func counterValue(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue()
		}
		return v
	}
	return 0
}

// histogramMean returns the mean of the histogram called name in reg.
func histogramMean(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() == 0 {
			return 0
		}
		return h.GetSampleSum() / float64(h.GetSampleCount())
	}
	return 0
}
