package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// revive lets a silenced device signal again.
func (d *devices) revive(id string) {
	d.mu.Lock()
	delete(d.silentAt, id)
	d.mu.Unlock()
}

// alarmLog is every alarm notification stored in the SIGWATCH stream.
type alarmLog = testenv.Recorder[dispatch.Alarm]

// watchAlarms records the alarm notifications; each must carry its id as Nats-Msg-Id.
func watchAlarms(t *testing.T, env *testenv.Env) *alarmLog {
	t.Helper()
	return recordWithIDs(t, env, "sigwatch.alarm.>", func(a dispatch.Alarm) string { return a.ID })
}

// recordWithIDs records the messages of the stream on filter; each must
// carry the id of its body as Nats-Msg-Id.
func recordWithIDs[T any](t *testing.T, env *testenv.Env, filter string, id func(T) string) *testenv.Recorder[T] {
	t.Helper()
	l := testenv.RecordStream[T](t, env.Conn(t), "SIGWATCH", filter)
	l.Require(func(e testenv.Event[T]) error {
		if e.MsgID != id(e.Body) {
			return fmt.Errorf("%s %s carries Nats-Msg-Id %q, want its id", e.Subject, id(e.Body), e.MsgID)
		}
		return nil
	})
	return l
}

// alarmsOf returns the notifications about device id, in stream order.
func alarmsOf(l *alarmLog, id string) []dispatch.Alarm {
	return l.Bodies(func(a dispatch.Alarm) bool { return a.Device == id })
}

func hasAlarm(l *alarmLog, id, state, reason string) bool {
	for _, a := range alarmsOf(l, id) {
		if a.State == state && (reason == "" || a.Reason == reason) {
			return true
		}
	}
	return false
}

// checkStoredOnce fails the test for every notification the stream stored more than once.
func checkStoredOnce(t *testing.T, env *testenv.Env) {
	t.Helper()
	for id, n := range testenv.StreamMsgIDs(t, env.Conn(t), "SIGWATCH", "sigwatch.alarm.") {
		if n != 1 {
			t.Errorf("notification %s stored %d times, want once", id, n)
		}
	}
}

func show(as []dispatch.Alarm) string {
	var b strings.Builder
	for _, a := range as {
		fmt.Fprintf(&b, "%s:%s/%d@%d ", a.State, a.Reason, a.Count, a.At%100000)
	}
	return b.String()
}

// TestAlarmsSurviveKills runs 120 alarms across a full sigwatch process and
// an alarm-only one, and kills them with -9 at random moments: the alarm
// worker alone, the whole process, then everything at once. After the
// restarts every alarm goes on repeating, every device that comes back gets
// its resolved, no notification is stored twice in the stream, and no
// repeat is skipped: counts go 1, 2, 3... and no repeat comes later than
// one interval after it was due (or, if it fell due during the kills,
// after the last restart).
func TestAlarmsSurviveKills(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const (
		threshold = time.Second
		interval  = 3 * time.Second
	)
	cfg := []string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(), "SIGWATCH_ALARM_INTERVAL=" + interval.String(),
		"SIGWATCH_SCANNER_LEASE_TTL=1s", "SIGWATCH_ALARM_ACK_WAIT=2s", "SIGWATCH_LOG_LEVEL=info",
		// 120 of 150 devices silenced would be a fleet storm: this test
		// is about each device's own alarm.
		"SIGWATCH_STORM_ENABLED=false"}
	full := func(name string) *proc { return startProc(t, env, name, cfg...) }
	worker := func(name string) *proc {
		return startProc(t, env, name, append(cfg, "SIGWATCH_ROLES=alarm")...)
	}
	pause := func() { time.Sleep(time.Duration(300+rand.IntN(1700)) * time.Millisecond) }

	f := full("full-1")
	w := worker("alarm-1")
	l := watchAlarms(t, env)
	d := startDevices(t, env.Mosquitto.URL, 150, 300*time.Millisecond)
	time.Sleep(2 * time.Second)
	// Silenced over one interval, so that some repeat is due at any moment
	// and every kill lands on some.
	var silent []string
	for k := range 120 {
		silent = append(silent, d.ids[k])
		d.silence(d.ids[k])
		time.Sleep(interval / 120)
	}
	testenv.WaitFor(t, 20*time.Second, "120 alarms raised", func() bool {
		for _, id := range silent {
			if !hasAlarm(l, id, alarm.Raised, "") {
				return false
			}
		}
		return true
	})

	pause()
	killsBegan := time.Now()
	w.kill()
	w = worker("alarm-2")
	pause()
	f.kill()
	f = full("full-2")
	pause()
	w.kill()
	f.kill()
	time.Sleep(time.Second)
	full("full-3")
	restarted := time.Now()

	// Every alarm goes on after the restarts.
	testenv.WaitFor(t, 3*interval, "a repeat of every alarm after the last restart", func() bool {
		for _, id := range silent {
			as := alarmsOf(l, id)
			if len(as) == 0 || as[len(as)-1].At < restarted.UnixMilli() {
				return false
			}
		}
		return true
	})
	back := time.Now()
	for _, id := range silent {
		d.revive(id)
	}
	testenv.WaitFor(t, 2*interval, "every alarm resolved/recovered", func() bool {
		for _, id := range silent {
			if !hasAlarm(l, id, alarm.Resolved, alarm.ReasonRecovered) {
				return false
			}
		}
		return true
	})
	testenv.Never(t, time.Second, "a notification stored twice", func() bool {
		for _, n := range l.MsgIDs() {
			if n > 1 {
				return true
			}
		}
		return false
	})
	checkStoredOnce(t, env)
	var late time.Duration
	for _, id := range silent {
		as := alarmsOf(l, id)
		if err := alarmSequence(as); err != nil {
			t.Errorf("device %s: %v: %s", id, err, show(as))
			continue
		}
		for j := 1; j < len(as); j++ {
			if as[j].State != alarm.Repeat {
				continue
			}
			due := as[j-1].At + interval.Milliseconds()
			lateness := time.Duration(as[j].At-due) * time.Millisecond
			late = max(late, lateness)
			// A repeat due while the kills went on may wait for the last
			// restart: a chain of kills can take its lease from each
			// replica in turn before it fires.
			from := due
			if due >= killsBegan.UnixMilli() && due < restarted.UnixMilli() {
				from = restarted.UnixMilli()
			}
			if as[j].At-from > interval.Milliseconds() {
				t.Errorf("device %s: repeat %d came %v after it was due, more than one interval after it could be (%s): %s",
					id, as[j].Count, lateness, time.UnixMilli(from).Format("15:04:05.000"), show(as))
			}
		}
		if res := as[len(as)-1]; res.At-back.UnixMilli() > interval.Milliseconds() {
			t.Errorf("device %s resolved %dms after it came back", id, res.At-back.UnixMilli())
		}
	}
	t.Logf("%d alarms; the latest repeat came %v after it was due", len(silent), late)
}

// alarmSequence checks the notifications of one device that had one alarm:
// raised, repeats counted 1, 2, 3..., one resolved at the end.
func alarmSequence(as []dispatch.Alarm) error {
	if len(as) < 2 || as[0].State != alarm.Raised || as[len(as)-1].State != alarm.Resolved {
		return fmt.Errorf("want raised, repeats, resolved")
	}
	for j, a := range as[1 : len(as)-1] {
		if a.State != alarm.Repeat || a.Count != j+1 || a.Since != as[0].Since {
			return fmt.Errorf("notification %d is %s/%d of alarm %d, want repeat/%d of %d", j+1, a.State, a.Count, a.Since, j+1, as[0].Since)
		}
	}
	return nil
}

// runCLI runs a sigwatch subcommand that talks to the HTTP API at addr.
func runCLI(t *testing.T, addr string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "SIGWATCH_API=http://"+addr)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestAlarmAPIAndCLI drives the stop conditions through the CLI and the
// HTTP API of a running process: an ack with --for pauses the repeats and
// they resume after it, an ack without one resolves, a mute by type
// suppresses that type only, and removing a device resolves its alarm.
func TestAlarmAPIAndCLI(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	const interval = time.Second
	startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT=1s", "SIGWATCH_ALARM_INTERVAL=1s",
		"SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_MQTT_TOPICS=devices/+/+/signal", "SIGWATCH_MQTT_ID_LEVEL=2",
		"SIGWATCH_MQTT_TYPE_LEVEL=1")
	l := watchAlarms(t, env)
	testenv.WaitFor(t, 20*time.Second, "the API", func() bool {
		_, err := runCLI(t, addr, "mute", "ls")
		return err == nil
	})
	if out, err := runCLI(t, addr, "mute", "add", "--type", "meter", "--for", "1h", "--comment", "maintenance"); err != nil {
		t.Fatalf("mute add: %v\n%s", err, out)
	}
	out, err := runCLI(t, addr, "mute", "ls", "--json")
	var mutes []alarm.Mute
	if err != nil || json.Unmarshal([]byte(out), &mutes) != nil || len(mutes) != 1 || mutes[0].Type != "meter" {
		t.Fatalf("mute ls: %v\n%s", err, out)
	}
	d := startDevices(t, env.Mosquitto.URL, 0, 200*time.Millisecond)
	topics := []string{"tracker/snooze", "tracker/ack", "tracker/rm", "meter/m1"}
	d.mu.Lock()
	d.ids = append(d.ids, topics...)
	d.mu.Unlock()
	time.Sleep(time.Second)
	for _, id := range topics {
		d.silence(id)
	}
	for _, id := range []string{"snooze", "ack", "rm"} {
		testenv.WaitFor(t, 10*time.Second, id+" repeating", func() bool { return hasAlarm(l, id, alarm.Repeat, "") })
	}

	out, err = runCLI(t, addr, "device", "ack", "snooze", "--for", "2s", "--json")
	var acked alarm.View
	if err != nil || json.Unmarshal([]byte(out), &acked) != nil || acked.State != "acked" {
		t.Fatalf("device ack --for: %v\n%s", err, out)
	}
	// The repeats the ack found sent are acked.Count; the next one must
	// wait for its end.
	if out, err := runCLI(t, addr, "device", "ack", "ack"); err != nil {
		t.Fatalf("device ack: %v\n%s", err, out)
	}
	if out, err := runCLI(t, addr, "device", "rm", "rm", "--json"); err != nil || !strings.Contains(out, `"alarm_resolved": true`) {
		t.Fatalf("device rm: %v\n%s", err, out)
	}
	testenv.WaitFor(t, 5*time.Second, "resolved acked and removed", func() bool {
		return hasAlarm(l, "ack", alarm.Resolved, alarm.ReasonAcked) && hasAlarm(l, "rm", alarm.Resolved, alarm.ReasonRemoved)
	})
	testenv.WaitFor(t, 3*interval, "repeats resumed after the ack", func() bool {
		as := alarmsOf(l, "snooze")
		return as[len(as)-1].Count > acked.Count
	})
	for _, a := range alarmsOf(l, "snooze") {
		if a.Count == acked.Count+1 && (a.State != alarm.Repeat || a.At < acked.AckedUntil || a.At > acked.AckedUntil+interval.Milliseconds()) {
			t.Errorf("after the ack until %d: %s, want the next repeat just after", acked.AckedUntil, show([]dispatch.Alarm{a}))
		}
	}
	out, err = runCLI(t, addr, "device", "get", "m1", "--json")
	if err != nil || !strings.Contains(out, `"state": "raised"`) {
		t.Errorf("device get of the muted device: %v\n%s, want its alarm raised underneath", err, out)
	}
	if as := alarmsOf(l, "m1"); len(as) != 0 {
		t.Errorf("muted type notified: %s", show(as))
	}
	if out, err := runCLI(t, addr, "mute", "rm", mutes[0].ID); err != nil {
		t.Fatalf("mute rm: %v\n%s", err, out)
	}
	testenv.WaitFor(t, 3*interval, "the meter notified once unmuted", func() bool { return hasAlarm(l, "m1", alarm.Repeat, "") })
	if out, err := runCLI(t, addr, "device", "ack", "ack"); err == nil || !strings.Contains(out, "no open alarm") {
		t.Errorf("ack of a resolved alarm: %v\n%s, want refused", err, out)
	}
	d.revive("tracker/snooze")
	d.revive("meter/m1")
	for _, id := range []string{"snooze", "m1"} {
		testenv.WaitFor(t, 5*time.Second, id+" resolved", func() bool { return hasAlarm(l, id, alarm.Resolved, alarm.ReasonRecovered) })
	}
	checkStoredOnce(t, env)
}

// TestAlarmAPIRefusals checks that the alarm endpoints refuse what they
// cannot do, saying why.
func TestAlarmAPIRefusals(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	app := startApp(t, env, nil)
	const tok = "t0ken"
	cases := []struct {
		method, path string
		body         any
		code         int
	}{
		{"POST", "/v1/devices/nobody/ack", nil, http.StatusConflict},
		{"POST", "/v1/devices/nobody/ack", map[string]string{"for": "soon"}, http.StatusBadRequest},
		{"POST", "/v1/devices/nobody/ack", map[string]any{"for": "1m", "until": 1}, http.StatusBadRequest},
		{"POST", "/v1/devices/nobody/ack", map[string]any{"until": 1}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]string{"for": "1h"}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]string{"device": "a", "type": "b", "for": "1h"}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]string{"type": "b"}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]string{"type": "b", "until": "2001-01-01T00:00:00Z"}, http.StatusBadRequest},
		{"DELETE", "/v1/mutes/none", nil, http.StatusNotFound},
		// Durations and times are range-checked.
		{"POST", "/v1/devices/nobody/ack", map[string]string{"for": "-1h"}, http.StatusBadRequest},
		{"POST", "/v1/devices/nobody/ack", map[string]string{"for": "100000h"}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]any{"type": "b", "until": 1e300}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]any{"type": "b", "until": -9.223372036854775808e18}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]any{"type": "b", "until": 1.5e12 + 0.5}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]string{"type": "b", "until": "9223372036854775807"}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]string{"type": "b", "until": "2999-01-01T00:00:00Z"}, http.StatusBadRequest},
		{"PUT", "/v1/devices/d1/threshold", map[string]string{"threshold": "-1s"}, http.StatusBadRequest},
		{"PUT", "/v1/devices/d1/threshold", map[string]string{"threshold": "9000h"}, http.StatusBadRequest},
		{"POST", "/v1/signals", []map[string]any{{"device": "d1", "ts": -1}}, http.StatusBadRequest},
		{"POST", "/v1/mutes", map[string]string{"type": "b", "until": time.Now().Add(time.Hour).Format(time.RFC3339)}, http.StatusCreated},
	}
	for _, c := range cases {
		if code, out := call(t, app, c.method, c.path, tok, c.body); code != c.code {
			t.Errorf("%s %s %v: %d %v, want %d", c.method, c.path, c.body, code, out, c.code)
		}
	}
}
