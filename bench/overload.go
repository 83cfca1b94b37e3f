package bench

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/ingest"
	"github.com/sigwatch/sigwatch/shard"
)

// drainedAge is the watermark age under which ingest counts as caught up.
const drainedAge = 100 * time.Millisecond

// overloadPhase names the three phases of an overload run.
var overloadPhases = []string{"before", "during", "after"}

// overloadRun is what one side of the overload scenario measured.
type overloadRun struct {
	Lag [3]lagStats // by the phase the deadline fell in
	// Drain is the time from the end of the surge until the watermark age
	// was back under drainedAge; negative if it never was.
	Drain time.Duration
	// MaxAge is the largest watermark age seen.
	MaxAge time.Duration
	// DrainRate is signals stored per second between the end of the surge
	// and the drain (0 if there was nothing to drain).
	DrainRate float64
	Offered   [3]float64 // signals/s asked of the publisher per phase
	Stored    [3]float64 // signals/s stored per phase
	Lost      int64      // acked by the broker but never stored
	Early     int        // lost events received before their deadline
	Shares    cpuShares
}

// overloadSide runs one side: with surge set, the rate doubles for
// OverloadSurge.
func (r *runner) overloadSide(ctx context.Context, surge bool) (overloadRun, error) {
	var res overloadRun
	what := "nominal"
	if surge {
		what = "surge"
	}
	n, m := r.prof.OverloadDevices, r.prof.OverloadVictims
	rate := float64(n) / r.prof.OverloadEvery.Seconds()
	if err := r.e.flush(ctx); err != nil {
		return res, err
	}
	store := shard.NewStore(r.e.rc, shard.NewKeys("sw"))
	ids := deviceIDs(n + m)
	far := time.Now().Add(10 * time.Minute).UnixMilli()
	if err := preload(ctx, store, ids, func(int) int64 { return far }); err != nil {
		return res, err
	}
	if err := preloadRegistry(ctx, store, ids, ""); err != nil {
		return res, err
	}

	w, err := newLostWatcher(ctx, r.e.ni.URL, "sigwatch.lost.>")
	if err != nil {
		return res, err
	}
	defer w.close()
	sys, err := watchSys(r.e.mosq.URL)
	if err != nil {
		return res, err
	}
	defer sys.close()

	// Ingest and the scanner, as `sigwatch run` wires them: the scanner on
	// a Redis client of its own, the watermark ingest's own.
	reg := prometheus.NewRegistry()
	start := time.Now()
	wl, log := newWarnLog(filepath.Join(r.e.dir, fmt.Sprintf("overload-%s-%d.log", what, start.UnixNano())))
	defer wl.close()
	topo, err := shard.NewWatcher(ctx, store, shards, 500*time.Millisecond, nil)
	if err != nil {
		return res, err
	}
	pub, err := dispatch.New(ctx, r.e.nc, dispatch.Options{})
	if err != nil {
		return res, err
	}
	// After ingest stops (deferred below): nothing of this run's publisher
	// stays subscribed on the shared connection into the next run.
	defer pub.Close()
	clientID := fmt.Sprintf("bench-overload-%d", start.UnixNano())
	in, err := ingest.New(ingest.Options{Brokers: []string{r.e.mosq.URL}, ClientID: clientID,
		Thresholds: shard.NewThresholds(store, threshold, nil)}, store, topo, pub, reg, log)
	if err != nil {
		return res, err
	}
	ictx, stopIngest := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { topo.Run(ictx) })
	wg.Go(func() {
		if err := in.Run(ictx); err != nil {
			r.p.Printf("overload", "%s: ingest stopped: %v", what, err)
		}
	})
	defer func() {
		stopIngest()
		wg.Wait()
		// The broker would keep queueing for the persistent session of a
		// run that ended, and charge the next run for it.
		if err := clearSession(r.e.mosq.URL, clientID); err != nil {
			r.p.Printf("overload", "%s: %v", what, err)
		}
	}()
	if !waitFor(ctx, 20*time.Second, func() bool {
		wm, _, err := store.Watermarks().Read(ctx)
		return err == nil && wm >= start.UnixMilli()
	}) {
		return res, fmt.Errorf("ingest did not subscribe within 20s")
	}
	g, err := r.startScanner(ctx, false)
	if err != nil {
		return res, err
	}
	defer g.stop()

	stored := func() int64 { return int64(counterValue(reg, "sigwatch_ingest_signals_total")) }
	lg, err := r.startLoadgen(r.e.mosq.URL, n)
	if err != nil {
		return res, err
	}
	loadStopped := false
	defer func() {
		if !loadStopped {
			lg.stop()
		}
	}()
	meter := r.newCPUMeter(ctx, map[string]int{"loadgen": lg.c.pid()})

	// Warm up at the nominal rate, then make the silent devices fall due
	// evenly over the three phases.
	lg.setRate(rate)
	time.Sleep(2 * time.Second)
	w.reset()
	t0 := time.Now()
	ends := [3]time.Time{t0.Add(r.prof.OverloadBefore)}
	ends[1] = ends[0].Add(r.prof.OverloadSurge)
	ends[2] = ends[1].Add(r.prof.OverloadAfter)
	window := ends[2].Sub(t0)
	step := float64(window.Milliseconds()) / float64(m)
	deadline := func(j int) int64 { return t0.UnixMilli() + int64(float64(j)*step) }
	if err := setDeadlines(ctx, r.e.rc, shard.NewKeys("sw"), ids[n:], deadline); err != nil {
		return res, err
	}

	// Sample the watermark's age and the backlog until the window ends and
	// ingest has drained (or a bound passes).
	var (
		maxAge    time.Duration
		drainedAt time.Time
		// underSince is when the age last went under drainedAge, and
		// storedUnder what was stored then.
		underSince  time.Time
		storedUnder int64
		surgeEnd    = ends[1]
		stored1     int64 // stored at the end of the surge
		phase       = -1
		phaseT      time.Time
		phaseD      int64
	)
	s0 := meter.sample()
	stopProf := func() {}
	defer func() { stopProf() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Now()
	hardEnd := ends[2].Add(30 * time.Second)
	for ctx.Err() == nil {
		now := <-tick.C
		k := 3
		for j, e := range ends {
			if now.Before(e) {
				k = j
				break
			}
		}
		if k != phase {
			// Close the previous phase's rates, open the next.
			d := stored()
			if phase >= 0 && phase < 3 {
				res.Stored[phase] = float64(d-phaseD) / now.Sub(phaseT).Seconds()
			}
			if k == 2 {
				stored1 = d
			}
			if surge && k == 1 {
				stopProf = r.cpuProfile("overload", "this process (ingest, scanner, lost-event publisher) during the 2× surge and the rest of the load")
			}
			if k < 3 {
				res.Offered[k] = rate
				if surge && k == 1 {
					res.Offered[k] = 2 * rate
				}
				lg.setRate(res.Offered[k])
			}
			phase, phaseT, phaseD = k, now, d
		}
		if k == 3 && !loadStopped {
			stopProf()
			stopProf = func() {}
			res.Shares = meter.since(s0)
			lg.stop()
			loadStopped = true
		}
		age := time.Duration(metricValue(reg, "sigwatch_ingest_watermark_age_seconds") * float64(time.Second))
		maxAge = max(maxAge, age)
		// Drained: the age stayed under drainedAge for a whole second.
		if age >= drainedAge || !now.After(surgeEnd) {
			underSince = time.Time{}
		} else if underSince.IsZero() {
			underSince, storedUnder = now, stored()
		}
		if drainedAt.IsZero() && !underSince.IsZero() && now.Sub(underSince) >= time.Second {
			drainedAt = underSince
			if el := drainedAt.Sub(surgeEnd); el >= 500*time.Millisecond {
				res.DrainRate = float64(storedUnder-stored1) / el.Seconds()
			}
		}
		if now.Sub(lastPrint) >= time.Second {
			lastPrint = now
			r.p.Printf("overload", "%s: phase %s offered %.0f/s; sent %d acked %d stored %d (behind %d), in flight %.0f, watermark age %s; "+
				"mosquitto stored msgs %s dropped %s; lost events %d/%d",
				what, phaseName(k), res.Offered[min(k, 2)], lg.sent.Load(), lg.acked.Load(), stored(), lg.sent.Load()-stored(),
				metricValue(reg, "sigwatch_ingest_inflight"), age.Round(time.Millisecond),
				sys.get("$SYS/broker/store/messages/count"), sys.get("$SYS/broker/publish/messages/dropped"), w.count(), m)
		}
		if k == 3 && ((!drainedAt.IsZero() && w.count() >= m) || now.After(hardEnd)) {
			break
		}
	}
	if drainedAt.IsZero() {
		res.Drain = -1
	} else {
		res.Drain = drainedAt.Sub(surgeEnd)
	}
	res.MaxAge = maxAge

	// Lag by the phase each deadline fell in.
	w.mu.Lock()
	byPhase := [3][]float64{}
	for id, lag := range w.byID {
		j, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(id, "@", 2)[0], "dev-"))
		if err != nil || j < n {
			continue
		}
		dl := time.UnixMilli(deadline(j - n))
		k := 0
		for k < 2 && !dl.Before(ends[k]) {
			k++
		}
		byPhase[k] = append(byPhase[k], lag)
		if lag < 0 {
			res.Early++
		}
	}
	w.mu.Unlock()
	for k := range byPhase {
		res.Lag[k] = summarize(byPhase[k])
	}
	if !waitFor(ctx, 10*time.Second, func() bool { return stored() >= lg.acked.Load() }) {
		res.Lost = lg.acked.Load() - stored()
	}
	if n, first := wl.summary(); n > 0 {
		r.p.Printf("overload", "%s: ingest logged %d warnings, the first: %q", what, n, first)
	}
	r.p.Printf("overload", "%s: lag before %s; during %s; after %s; drain %s, max watermark age %s, drain rate %.0f/s; %d lost events of %d",
		what, res.Lag[0], res.Lag[1], res.Lag[2], res.Drain.Round(time.Millisecond), maxAge.Round(time.Millisecond),
		res.DrainRate, w.count(), m)
	if w.count() < m {
		return res, fmt.Errorf("%d of %d lost events received", w.count(), m)
	}
	return res, nil
}

func phaseName(k int) string {
	if k < len(overloadPhases) {
		return overloadPhases[k]
	}
	return "stopped"
}

// clearSession ends the persistent session clientID left on the broker at
// url, by connecting once with a clean session.
func clearSession(url, clientID string) error {
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID(clientID).SetCleanSession(true))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return fmt.Errorf("bench: clear session %s: %v", clientID, tok.Error())
	}
	c.Disconnect(0)
	return nil
}

// metricValue returns the value of the gauge or counter called name in reg.
func metricValue(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return math.NaN()
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var v float64
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil {
				v += g.GetValue()
			} else {
				v += m.GetCounter().GetValue()
			}
		}
		return v
	}
	return math.NaN()
}

// sysWatcher keeps the latest value of Mosquitto's $SYS topics.
type sysWatcher struct {
	c    mqtt.Client
	mu   sync.Mutex
	vals map[string]string
}

func watchSys(url string) (*sysWatcher, error) {
	s := &sysWatcher{vals: map[string]string{}}
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("bench-sys-%d", time.Now().UnixNano())).
		SetCleanSession(true).SetAutoReconnect(true)
	s.c = mqtt.NewClient(o)
	if tok := s.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("bench: $SYS watcher: connect: %v", tok.Error())
	}
	tok := s.c.Subscribe("$SYS/broker/#", 0, func(_ mqtt.Client, m mqtt.Message) {
		s.mu.Lock()
		s.vals[m.Topic()] = string(m.Payload())
		s.mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		s.c.Disconnect(0)
		return nil, fmt.Errorf("bench: $SYS watcher: subscribe: %v", tok.Error())
	}
	return s, nil
}

func (s *sysWatcher) get(topic string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vals[topic]; ok {
		return v
	}
	return "?"
}

func (s *sysWatcher) close() { s.c.Disconnect(0) }
