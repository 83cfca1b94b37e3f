package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestStalledReplicaBringsNothingBack proves invariant 8 (late is not new)
// with real processes: one of two replicas is frozen (SIGSTOP) for three
// lease times while a 500-device fleet keeps signalling and some devices go
// silent; the other replica reports them lost. When the frozen one resumes,
// it drains its backlog of old signals. Nothing may come back: no
// `recovered`, exactly one `lost` id per silenced device, none early, no
// live device lost — with each replica consuming the whole stream and with
// the two sharing a group, with receive and with payload timestamps.
func TestStalledReplicaBringsNothingBack(t *testing.T) {
	for _, c := range []struct{ group, mode string }{
		{"", "receive"}, {"", "payload"}, {"sigwatch", "receive"}, {"sigwatch", "payload"},
	} {
		name := "redundant"
		if c.group != "" {
			name = "shared"
		}
		t.Run(name+"/"+c.mode, func(t *testing.T) {
			stallReplica(t, c.group, c.mode)
		})
	}
}

func stallReplica(t *testing.T, group, mode string) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	// The fleet runs in this process, which a loaded machine stalls at
	// times: 3s leaves a live device 2.5s of stall beyond its 500ms period
	// (2s left 1.5s: a 1.8s stall lost one). A device silenced in the
	// pause's first second still falls due 2s before the frozen replica
	// resumes (with redundant replicas the working one reports all 50
	// then, as with 2s).
	const (
		threshold = 3 * time.Second
		lease     = 2 * time.Second
		pause     = 3 * lease
	)
	settings := []string{
		"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(),
		"SIGWATCH_SCANNER_LEASE_TTL=" + lease.String(),
		"SIGWATCH_MQTT_SHARED_GROUP=" + group,
		"SIGWATCH_TIMESTAMP_MODE=" + mode,
		"SIGWATCH_LOG_LEVEL=info",
	}
	a := startProc(t, env, "a", append(settings, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-a")...)
	startProc(t, env, "b", append(settings, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-b")...)
	lost := watchLost(t, env)
	recovered := testenv.RecordStream[dispatch.Recovered](t, env.Conn(t), "SIGWATCH", "sigwatch.recovered.>")
	d := startFleet(t, env.Mosquitto.URL, 500, 500*time.Millisecond, mode == "payload")
	time.Sleep(3 * time.Second)

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = a.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume) // a stopped process ignores the SIGKILL of the cleanup until continued
	// Devices go silent during the first second of the pause: the working
	// replica reports them lost while the frozen one still holds their
	// signals in its backlog.
	for i := 0; i < 50; i++ {
		d.silence(d.ids[i*10])
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	before := lost.Len()
	resume()
	t.Logf("replica a frozen for %v; %d lost events while it was", time.Since(stopped).Round(time.Millisecond), before)

	waitAllLost(t, lost, d, 30*time.Second)
	// The backlog drains, and a false recovery would be lost again a
	// threshold later: watch for twice that.
	neverLiveLost(t, lost, d, 2*threshold+time.Second)

	silenced := d.silenced()
	var falseBack, multi, maxIDs, early int
	for _, ev := range recovered.Bodies(nil) {
		falseBack++
		if _, ok := silenced[ev.Device]; !ok {
			t.Logf("recovered event for live device %s: %+v", ev.Device, ev)
		}
	}
	for id, evs := range byDevice(lost) {
		if _, ok := silenced[id]; !ok {
			continue // neverLiveLost reports these
		}
		ids := map[string]bool{}
		for _, ev := range evs {
			ids[ev.ID] = true
			d.mu.Lock()
			last := d.last[id]
			d.mu.Unlock()
			if ev.FiredAt < ev.Deadline || time.UnixMilli(ev.FiredAt).Before(last.Add(threshold).Truncate(time.Millisecond)) {
				early++
			}
		}
		if len(ids) != 1 {
			multi++
		}
		maxIDs = max(maxIDs, len(ids))
	}
	t.Logf("%d silenced devices: %d recovered events, %d with more than one lost id (at most %d), %d early lost events",
		len(silenced), falseBack, multi, maxIDs, early)
	if falseBack != 0 || multi != 0 || early != 0 {
		t.Errorf("got %d recovered events, %d devices with more than one lost id, %d early; want 0, 0, 0", falseBack, multi, early)
	}
	checkExactlySilenced(t, lost, d, threshold)
}
