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
		time.Sleep(window + time.Second)
		if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "a continued", func() bool {
			return bytes.Count(readLog(t, a), []byte("test seam: continued")) == freezes
		})
		time.Sleep(3 * time.Second) // a's held publishes land now, or are refused
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
	if !bytes.Contains(readLog(t, a), []byte("fenced out")) {
		t.Errorf("a's log does not say the stream refused its held notifications")
	}
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
