package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestPausedAlarmWorkerPublishesNothingStale: alarm worker a stops itself
// (SIGSTOP, the freeze test seam) holding the raised notifications of 100
// devices it has just stored; worker b takes the events over and publishes
// them; a is released (SIGCONT) after more than nats.duplicates. Then the
// same with the resolved notifications of the devices' return. Every
// notification id must be stored once, and every device's alarm be one
// raised and one resolved.
func TestPausedAlarmWorkerPublishesNothingStale(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const (
		n      = 100
		window = 2 * time.Second
	)
	common := []string{"SIGWATCH_THRESHOLDS_DEFAULT=1s", "SIGWATCH_NATS_DUPLICATES=" + window.String(),
		"SIGWATCH_ALARM_ACK_WAIT=1s", "SIGWATCH_ALARM_INTERVAL=10m", "SIGWATCH_SCANNER_LEASE_TTL=1s",
		"SIGWATCH_STORM_ENABLED=false"}
	worker := func(name string, extra ...string) *proc {
		return startProc(t, env, name, append(append(common, "SIGWATCH_ROLES=alarm"), extra...)...)
	}
	startProc(t, env, "edge", append(common, "SIGWATCH_ROLES=ingest,scanner,api")...)
	a := worker("a", "SIGWATCH_ALARM_WORKERS=128", fmt.Sprintf("SIGWATCH_TEST_FREEZE_BEFORE_NOTIFY=%d", n))
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	l := watchAlarms(t, env)
	d := startDevices(t, env.Mosquitto.URL, n, 200*time.Millisecond)
	time.Sleep(3 * time.Second) // every device is watched

	// round holds the notifications of state in a, has b publish them and
	// releases a past the window.
	round := func(state string, freezes int, act func()) {
		act()
		held := waitFrozen(t, a, freezes, 20*time.Second)
		if held < n*9/10 {
			t.Fatalf("a froze holding %d %s notifications, want about %d", held, state, n)
		}
		if as := l.Bodies(func(a dispatch.Alarm) bool { return a.State == state }); len(as) != 0 {
			t.Fatalf("%d %s notifications stored while a held them, want 0: %+v", len(as), state, as[0])
		}
		b := worker(fmt.Sprintf("b-%s", state))
		testenv.WaitFor(t, 20*time.Second, "b publishes every "+state, func() bool { return countState(l, state) == n })
		time.Sleep(window + 500*time.Millisecond)
		release(t, a)
		t.Logf("a held %d %s notifications past the window; %d stored", held, state, countState(l, state))
		b.kill()
	}
	round(alarm.Raised, 1, func() {
		for _, id := range d.ids {
			d.silence(id)
		}
	})
	round(alarm.Resolved, 2, func() {
		for _, id := range d.ids {
			d.revive(id)
		}
	})

	for id, c := range l.MsgIDs() {
		if c != 1 {
			t.Errorf("notification %s stored %d times, want once", id, c)
		}
	}
	checkStoredOnce(t, env)
	for _, id := range d.ids {
		as := alarmsOf(l, id)
		if err := alarmSequence(as); err != nil || len(as) != 2 {
			t.Errorf("device %s: want raised then resolved: %v: %s", id, err, show(as))
		}
	}
}

// release continues p (SIGCONT) and waits until it says so, and a moment
// more for what it held to land or be refused.
func release(t *testing.T, p *proc) {
	t.Helper()
	before := bytes.Count(readLog(t, p), []byte("test seam: continued"))
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, p.log+": continued", func() bool {
		return bytes.Count(readLog(t, p), []byte("test seam: continued")) > before
	})
	time.Sleep(1500 * time.Millisecond)
}

// countState counts the notifications of state stored.
func countState(l *alarmLog, state string) int {
	return len(l.Bodies(func(a dispatch.Alarm) bool { return a.State == state }))
}

var frozenLine = regexp.MustCompile(`test seam: freezing with (\d+) notifications in hand`)

// waitFrozen waits until p has frozen itself the freezes-th time and is
// stopped, and returns how many notifications it held then.
func waitFrozen(t *testing.T, p *proc, freezes int, timeout time.Duration) int {
	t.Helper()
	var held int
	testenv.WaitFor(t, timeout, fmt.Sprintf("%s frozen (%d)", p.log, freezes), func() bool {
		m := frozenLine.FindAllSubmatch(readLog(t, p), -1)
		if len(m) < freezes || !stopped(p) {
			return false
		}
		held, _ = strconv.Atoi(string(m[freezes-1][1]))
		return true
	})
	return held
}

// stopped reports whether p is stopped by a signal.
func stopped(p *proc) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'T'
}

func readLog(t *testing.T, p *proc) []byte {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPausedAlarmWorkerPublishesNoStaleStorm: alarm worker a stops itself
// right after it stored the start of group g0's storm, before its event
// went out; worker b carries the storm out; a is released after more than
// nats.duplicates. Then the same with the storm's end. One started and one
// ended event must be stored, each once, with one scope alarm raised and
// resolved and no device alarm.
func TestPausedAlarmWorkerPublishesNoStaleStorm(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const window = 2 * time.Second
	common := append([]string{"SIGWATCH_THRESHOLDS_DEFAULT=1s", "SIGWATCH_NATS_DUPLICATES=" + window.String(),
		"SIGWATCH_ALARM_ACK_WAIT=1s", "SIGWATCH_ALARM_INTERVAL=10m", "SIGWATCH_SCANNER_LEASE_TTL=1s",
		"SIGWATCH_STORM_HOLD=2s"}, groupedConfig...)
	worker := func(name string, extra ...string) *proc {
		return startProc(t, env, name, append(append(common, "SIGWATCH_ROLES=alarm"), extra...)...)
	}
	startProc(t, env, "edge", append(common, "SIGWATCH_ROLES=ingest,scanner,api")...)
	a := worker("a", "SIGWATCH_TEST_FREEZE_BEFORE_NOTIFY=storm:1")
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	alarms := watchAlarms(t, env)
	storms := watchStorms(t, env)
	f := startGroupedFleet(t, env.Mosquitto.URL, 6, 20, 200*time.Millisecond) // g0 is a sixth: no fleet storm
	time.Sleep(3 * time.Second)
	g0 := f.groups[0]

	round := func(state string, freezes int, act func()) {
		act()
		waitFrozen(t, a, freezes, 20*time.Second)
		if got := stormsOf(storms, dispatch.ScopeGroup, "g0", state); len(got) != 0 {
			t.Fatalf("%d g0 storm %s events stored while a held it, want 0: %+v (now %d)", len(got), state, got[0], time.Now().UnixMilli())
		}
		b := worker("b-" + state)
		storms.Wait(t, 20*time.Second, "b publishes the storm "+state, func(s dispatch.Storm) bool {
			return s.Group == "g0" && s.State == state
		})
		time.Sleep(window + 500*time.Millisecond)
		release(t, a)
		b.kill()
	}
	round(alarm.StormStarted, 1, func() { f.silenceAll(g0) })
	testenv.WaitFor(t, 10*time.Second, "the g0 alarm raised", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Raised) })
	round(alarm.StormEnded, 2, func() { f.reviveAll(g0) })
	testenv.WaitFor(t, 10*time.Second, "the g0 alarm resolved", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Resolved) })

	for _, state := range []string{alarm.StormStarted, alarm.StormEnded} {
		if n := len(stormsOf(storms, dispatch.ScopeGroup, "g0", state)); n != 1 {
			t.Errorf("%d g0 storm %s events, want 1", n, state)
		}
	}
	for id, n := range storms.MsgIDs() {
		if n != 1 {
			t.Errorf("storm event %s stored %d times, want once", id, n)
		}
	}
	if as := scopeAlarms(alarms, "g0"); alarmSequence(as) != nil || len(as) != 2 {
		t.Errorf("g0 alarm: want raised then resolved: %s", show(as))
	}
	if n := deviceAlarms(alarms, g0); n != 0 {
		t.Errorf("%d device alarm notifications for g0, want 0", n)
	}
	checkStoredOnce(t, env)
}
