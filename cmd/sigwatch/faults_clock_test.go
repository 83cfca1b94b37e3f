package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// memberWatch polls the ingest members and the scanner replicas in Redis and
// counts every time one that had joined is found missing: both processes run
// the whole test, so a missing member was evicted by another's clock.
type memberWatch struct {
	mu       sync.Mutex
	ingest   map[string]bool // members seen
	scanners map[string]bool
	evicted  []string // "what@elapsed" of each eviction seen
}

func watchMembers(t *testing.T, env *testenv.Env) *memberWatch {
	t.Helper()
	store := env.Store(t, "sw")
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	scanners := shard.NewKeys("sw").Scanners()
	w := &memberWatch{ingest: map[string]bool{}, scanners: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ms, err := store.Watermarks().Members(ctx)
			if err != nil {
				continue
			}
			live, err := c.Do(ctx, c.B().Zrange().Key(scanners).Min("0").Max("-1").Build()).AsStrSlice()
			if err != nil {
				continue
			}
			w.saw(w.ingest, keys(ms), "ingest member", time.Since(start))
			w.saw(w.scanners, live, "scanner replica", time.Since(start))
		}
	}()
	t.Cleanup(func() { cancel(); <-done; c.Close() })
	return w
}

func keys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (w *memberWatch) saw(seen map[string]bool, now []string, what string, at time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	present := map[string]bool{}
	for _, m := range now {
		present[m] = true
		seen[m] = true
	}
	for m := range seen {
		if !present[m] {
			w.evicted = append(w.evicted, fmt.Sprintf("%s %s@%v", what, m, at.Round(time.Millisecond)))
		}
	}
}

func (w *memberWatch) report() (ingest, scanners int, evicted []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ingest), len(w.scanners), append([]string(nil), w.evicted...)
}

// TestClockSkewTwoProcesses runs two sigwatch processes whose host clocks are
// 5 s ahead and 5 s behind (invariant 9), with ingest both ways: each
// process consuming the whole stream, and the two splitting it in a shared
// group. Devices signal over Mosquitto and some go silent. Seen from outside
// (the test's clock, which is also Redis's): no device is reported lost
// before its last signal plus the threshold, each silenced device exactly
// once and no live one; no ingest member or scanner replica is ever dropped
// by the other's clock, and no outage is recorded; every alarm repeats at the
// configured interval.
func TestClockSkewTwoProcesses(t *testing.T) {
	for _, group := range []string{"", "sigwatch"} {
		name := "redundant"
		if group != "" {
			name = "shared"
		}
		t.Run(name, func(t *testing.T) { runClockSkew(t, group) })
	}
}

func runClockSkew(t *testing.T, group string) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const (
		threshold = 2 * time.Second
		interval  = 2 * time.Second
		skew      = 5 * time.Second
	)
	cfg := []string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(), "SIGWATCH_ALARM_INTERVAL=" + interval.String(),
		"SIGWATCH_MQTT_SHARED_GROUP=" + group, "SIGWATCH_LOG_LEVEL=info"}
	members := watchMembers(t, env)
	ahead := startProc(t, env, "ahead", append(cfg, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-ahead", "SIGWATCH_TEST_CLOCK_SKEW="+skew.String())...)
	behind := startProc(t, env, "behind", append(cfg, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-behind", "SIGWATCH_TEST_CLOCK_SKEW=-"+skew.String())...)
	l := watchLost(t, env)
	alarms := watchAlarms(t, env)
	d := startDevices(t, env.Mosquitto.URL, 200, 300*time.Millisecond)
	testenv.WaitFor(t, 10*time.Second, "both processes joined as ingest members and scanner replicas", func() bool {
		in, sc, _ := members.report()
		return in == 2 && sc == 2
	})
	time.Sleep(threshold + time.Second)
	var silent []string
	for i := 0; i < 20; i++ {
		id := d.ids[i*9]
		silent = append(silent, id)
		d.silence(id)
		time.Sleep(50 * time.Millisecond)
	}
	waitAllLost(t, l, d, 20*time.Second)
	// Not fatal: the checks below say what went wrong.
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		n := 0
		for _, id := range silent {
			if len(alarmsOf(alarms, id)) >= 3 {
				n++
			}
		}
		if n == len(silent) {
			break
		}
	}
	time.Sleep(threshold) // live devices keep going; a false report would show up now

	// No early fire, seen from outside: the event arrived no sooner than the
	// device's last acknowledged signal plus the threshold, and its deadline
	// is on the same time base. The test's clock is Redis's (one host): a
	// deadline stamped on the Redis clock is off by at most the clock's
	// uncertainty, well under 5 ms.
	var (
		fireLags                       []time.Duration
		early, earlyDeadline, liveLost []string
	)
	silenced := d.silenced()
	perDevice := map[string]int{}
	for _, e := range l.Events() {
		id := e.Body.Device
		perDevice[id]++
		if _, ok := silenced[id]; !ok {
			liveLost = append(liveLost, id)
		}
		d.mu.Lock()
		last, ok := d.last[id]
		d.mu.Unlock()
		if !ok {
			continue
		}
		due := last.Add(threshold)
		if e.At.Before(due) {
			early = append(early, fmt.Sprintf("%s %v early", id, due.Sub(e.At).Round(time.Millisecond)))
		}
		if dl := time.UnixMilli(e.Body.Deadline); dl.Before(due.Add(-5 * time.Millisecond)) {
			earlyDeadline = append(earlyDeadline, fmt.Sprintf("%s %v early", id, due.Sub(dl).Round(time.Millisecond)))
		}
		fireLags = append(fireLags, e.At.Sub(due))
	}
	var twice []string
	for id, n := range perDevice {
		if n != 1 {
			twice = append(twice, fmt.Sprintf("%s %d times", id, n))
		}
	}
	for name, got := range map[string][]string{
		"reported lost before last signal + threshold (invariant 1)": early,
		"with a deadline before last signal + threshold":             earlyDeadline,
		"live devices reported lost":                                 liveLost,
		"devices reported lost more than once":                       twice,
	} {
		if len(got) > 0 {
			t.Errorf("%d lost events %s, first: %s", len(got), name, strings.Join(got[:min(5, len(got))], "; "))
		}
	}
	for id := range silenced {
		if perDevice[id] == 0 {
			t.Errorf("silenced device %s never reported lost (invariant 2)", id)
		}
	}
	sort.Slice(fireLags, func(i, j int) bool { return fireLags[i] < fireLags[j] })
	if n := len(fireLags); n > 0 {
		t.Logf("lost events after last signal + threshold: min %v median %v max %v over %d events",
			fireLags[0].Round(time.Millisecond), fireLags[n/2].Round(time.Millisecond), fireLags[n-1].Round(time.Millisecond), n)
		// A deadline on a clock ahead fires that much late.
		if worst := fireLags[n-1]; worst > skew/2 {
			t.Errorf("a lost event came %v after its last signal + threshold, want well under the %v skew", worst, skew)
		}
	}

	// Alarms repeat at the configured interval: raised, repeat, repeat...
	// Each notification's time is on the one clock (it arrives after it,
	// never before, and by much less than the skew), and consecutive ones
	// are an interval apart, never less (a repeat is due an interval after
	// the last was handled) and not a skew more.
	var (
		gaps, delays []time.Duration
		notRepeating []string
	)
	for _, id := range silent {
		evs := alarms.Where(func(a dispatch.Alarm) bool { return a.Device == id })
		var states []string
		for j, e := range evs {
			states = append(states, e.Body.State)
			delays = append(delays, e.At.Sub(time.UnixMilli(e.Body.At)))
			if j > 0 {
				gaps = append(gaps, time.Duration(e.Body.At-evs[j-1].Body.At)*time.Millisecond)
			}
		}
		if len(states) < 3 || states[0] != alarm.Raised || states[1] != alarm.Repeat || states[2] != alarm.Repeat {
			notRepeating = append(notRepeating, id+": "+strings.Join(states, ","))
		}
	}
	if len(notRepeating) > 0 {
		t.Errorf("%d of %d alarms did not go raised, repeat, repeat; first: %s", len(notRepeating), len(silent),
			strings.Join(notRepeating[:min(5, len(notRepeating))], "; "))
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	if n := len(gaps); n > 0 {
		t.Logf("alarm repeat gaps: min %v median %v max %v over %d (interval %v)", gaps[0], gaps[n/2], gaps[n-1], n, interval)
		if gaps[0] < interval-5*time.Millisecond || gaps[n-1] > interval+skew/2 {
			t.Errorf("alarm repeat gaps from %v to %v, want the %v interval", gaps[0], gaps[n-1], interval)
		}
	}
	if n := len(delays); n > 0 {
		t.Logf("alarm notifications arrived after their time: min %v median %v max %v", delays[0].Round(time.Millisecond),
			delays[n/2].Round(time.Millisecond), delays[n-1].Round(time.Millisecond))
		if delays[0] < -5*time.Millisecond || delays[n-1] > skew/2 {
			t.Errorf("alarm notifications arrived from %v to %v after the time they carry, want after it and well within the %v skew",
				delays[0], delays[n-1], skew)
		}
	}
	checkStoredOnce(t, env)

	in, sc, evicted := members.report()
	t.Logf("ingest members %d, scanner replicas %d, evictions seen %d", in, sc, len(evicted))
	if len(evicted) > 0 {
		t.Errorf("members dropped while both processes ran (%d), first: %s", len(evicted), strings.Join(evicted[:min(5, len(evicted))], "; "))
	}
	// The operator is told that the hosts' clocks are off.
	for _, p := range []*proc{ahead, behind} {
		b, err := os.ReadFile(p.log)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "differs from Redis server time") {
			t.Errorf("%s logged nothing about its clock being %v off", p.log, skew)
		}
	}
	if _, outs, err := env.Store(t, "sw").Watermarks().Read(context.Background()); err != nil {
		t.Fatal(err)
	} else if len(outs) > 0 {
		t.Errorf("%d outages recorded while ingest ran throughout, first %+v", len(outs), outs[0])
	}
}
