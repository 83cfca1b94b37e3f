package main

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestRollingRestartSharedGroup restarts each of two ingest members of one
// shared subscription group in turn, twice, with SIGTERM, while devices
// keep signalling: a member stopping on purpose hands its share of the
// stream over without losing a signal (invariants 1 and 6). Devices that
// kept signalling are never reported lost, and devices that go silent just
// as a member stops are reported once, never before their last signal plus
// the threshold: a signal the stopping member dropped would show as an early
// fire.
func TestRollingRestartSharedGroup(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold = 2 * time.Second
	thr := "SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String()
	g := "SIGWATCH_MQTT_SHARED_GROUP=sigwatch"
	member := func(name string, round int) *proc {
		return startProc(t, env, fmt.Sprintf("%s%d", name, round), thr, g, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-"+name)
	}
	procs := map[string]*proc{"a": member("a", 0), "b": member("b", 0)}
	l := watchLost(t, env)
	d := startDevices(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
	time.Sleep(3 * time.Second)

	const silencedPerStop = 15
	next := 0
	for round := 1; round <= 2; round++ {
		for _, name := range []string{"a", "b"} {
			p := procs[name]
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			// Devices whose last signal reaches the broker while the member
			// stops.
			time.Sleep(250 * time.Millisecond)
			for range silencedPerStop {
				d.silence(d.ids[next*5])
				next++
			}
			_ = p.cmd.Wait()
			if code := p.cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("member %s exited %d after SIGTERM, want 0", name, code)
			}
			procs[name] = member(name, round)
			// The other member carries the stream alone meanwhile; give the
			// new one time to join before the next stop.
			time.Sleep(threshold)
		}
	}
	waitAllLost(t, l, d, 20*time.Second)
	// Anything lost during the last restart fires within a threshold.
	time.Sleep(threshold)
	live := 0
	for id := range byDevice(l) {
		if _, ok := d.silenced()[id]; !ok {
			live++
		}
	}
	t.Logf("%d lost events; %d for devices that kept signalling", l.Len(), live)
	checkExactlySilenced(t, l, d, threshold)
}
