package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// stormLog is every storm event stored in the SIGWATCH stream; each must
// carry its id as Nats-Msg-Id.
type stormLog = testenv.Recorder[dispatch.Storm]

func watchStorms(t *testing.T, env *testenv.Env) *stormLog {
	t.Helper()
	return recordWithIDs(t, env, "sigwatch.storm", func(s dispatch.Storm) string { return s.ID })
}

// groupedFleet is a fleet whose devices publish on devices/<group>/<id>/signal.
type groupedFleet struct {
	*devices
	groups [][]string // topic ids ("<group>/<id>") by group
}

func startGroupedFleet(t *testing.T, broker string, groups, per int, period time.Duration) *groupedFleet {
	t.Helper()
	f := &groupedFleet{devices: startDevices(t, broker, 0, period)}
	var all []string
	for g := range groups {
		var ids []string
		for k := range per {
			ids = append(ids, fmt.Sprintf("g%d/d%d-%03d", g, g, k))
		}
		f.groups = append(f.groups, ids)
		all = append(all, ids...)
	}
	f.mu.Lock()
	f.ids = all
	f.mu.Unlock()
	return f
}

// groupedConfig reads the group from the topic level before the id.
var groupedConfig = []string{"SIGWATCH_MQTT_TOPICS=devices/+/+/signal", "SIGWATCH_MQTT_GROUP_LEVEL=1", "SIGWATCH_MQTT_ID_LEVEL=2"}

// deviceOf is the device id of a topic id "<group>/<id>".
func deviceOf(topicID string) string { _, id, _ := strings.Cut(topicID, "/"); return id }

func (f *groupedFleet) silenceAll(ids []string) {
	for _, id := range ids {
		f.silence(id)
	}
}

func (f *groupedFleet) reviveAll(ids []string) {
	for _, id := range ids {
		f.revive(id)
	}
}

// deviceAlarms counts the notifications about the devices of ids.
func deviceAlarms(l *alarmLog, ids []string) int {
	in := map[string]bool{}
	for _, id := range ids {
		in[deviceOf(id)] = true
	}
	return len(l.Bodies(func(a dispatch.Alarm) bool { return in[a.Device] }))
}

// scopeAlarms returns the notifications of the storm alarm of group g (""
// for the fleet's), in stream order.
func scopeAlarms(l *alarmLog, g string) []dispatch.Alarm {
	return l.Bodies(func(a dispatch.Alarm) bool { return a.Device == "" && a.Group == g })
}

func hasScopeAlarm(l *alarmLog, g, state string) bool {
	for _, a := range scopeAlarms(l, g) {
		if a.State == state {
			return true
		}
	}
	return false
}

func stormsOf(l *stormLog, scope, g, state string) []dispatch.Storm {
	return l.Bodies(func(s dispatch.Storm) bool { return s.Scope == scope && s.Group == g && s.State == state })
}

// countWhere counts the lost or recovered events about the devices of ids
// that match.
func lostOf(l *lostLog, ids []string) map[string]int {
	in := map[string]bool{}
	for _, id := range ids {
		in[deviceOf(id)] = true
	}
	out := map[string]int{}
	for _, ev := range l.Bodies(func(ev dispatch.Lost) bool { return in[ev.Device] }) {
		out[ev.Device]++
	}
	return out
}

// TestStorms runs 1,000 devices in 10 groups of 100 on one process.
//
//  1. Group g0 goes dark at once: 100 lost events (with their group), one
//     storm started for g0, one g0 alarm raised, no device alarm for g0.
//     Meanwhile 5 devices of g1 go silent alone: 5 ordinary device alarms.
//  2. g0 comes back: its storm ends, its alarm is resolved, 100 recovered
//     events, and still no device alarm for g0.
//  3. 30% of the fleet, 30 devices of each group, goes dark: one fleet
//     storm, no group storm, no device alarm for them.
//
// GET /v1/storms and `sigwatch storm ls` show the storms.
func TestStorms(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	const threshold, hold = 2 * time.Second, 2 * time.Second
	startProc(t, env, "sigwatch", append([]string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(),
		"SIGWATCH_STORM_HOLD=" + hold.String(), "SIGWATCH_ALARM_INTERVAL=3s", "SIGWATCH_HTTP_ADDR=" + addr,
		"SIGWATCH_LOG_LEVEL=info"}, groupedConfig...)...)
	lost := watchLost(t, env)
	alarms := watchAlarms(t, env)
	storms := watchStorms(t, env)
	recovered := testenv.RecordStream[dispatch.Recovered](t, env.Conn(t), "SIGWATCH", "sigwatch.recovered.>")
	f := startGroupedFleet(t, env.Mosquitto.URL, 10, 100, 600*time.Millisecond)
	waitCounted(t, addr, 1000)
	time.Sleep(threshold)

	// 1. g0 dark, 5 of g1 alone.
	g0, few := f.groups[0], f.groups[1][:5]
	f.silenceAll(g0)
	f.silenceAll(few)
	testenv.WaitFor(t, 20*time.Second, "100 lost events of g0", func() bool { return len(lostOf(lost, g0)) == 100 })
	for _, ev := range lost.Bodies(func(ev dispatch.Lost) bool { return strings.HasPrefix(ev.Device, "d0-") }) {
		if ev.Group != "g0" {
			t.Fatalf("lost event %s carries group %q, want g0", ev.ID, ev.Group)
		}
	}
	storms.Wait(t, 10*time.Second, "g0 storm started", func(s dispatch.Storm) bool {
		return s.Scope == dispatch.ScopeGroup && s.Group == "g0" && s.State == alarm.StormStarted
	})
	testenv.WaitFor(t, 10*time.Second, "the g0 alarm raised", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Raised) })
	testenv.WaitFor(t, 15*time.Second, "5 device alarms for g1's silent devices", func() bool {
		for _, id := range few {
			if !hasAlarm(alarms, deviceOf(id), alarm.Raised, "") {
				return false
			}
		}
		return true
	})
	time.Sleep(hold + time.Second)
	if n := deviceAlarms(alarms, g0); n != 0 {
		t.Errorf("%d device alarm notifications for g0 during its storm, want 0", n)
	}
	st := stormsOf(storms, dispatch.ScopeGroup, "g0", alarm.StormStarted)
	if len(st) != 1 || st[0].Watched != 100 || st[0].Devices < 50 || st[0].Devices > 100 {
		t.Errorf("g0 storm started events %+v, want one with 100 watched and 50..100 lost", st)
	}
	out, err := runCLI(t, addr, "storm", "ls")
	if err != nil || !strings.Contains(out, "g0") || !strings.Contains(out, alarm.StormActive) || !strings.Contains(out, "HELD") {
		t.Errorf("storm ls during the storm: %v\n%s", err, out)
	}
	out, err = runCLI(t, addr, "alarm", "ls", "--state", "held", "--group", "g0", "--all", "--json")
	var held api.AlarmList
	if err != nil || json.Unmarshal([]byte(out), &held) != nil || len(held.Alarms) == 0 {
		t.Errorf("alarm ls --state held --group g0 during the storm: %v\n%s", err, out)
	}
	for _, a := range held.Alarms {
		if a.Group != "g0" || a.State != "held" {
			t.Errorf("alarm ls --state held --group g0 lists %+v", a)
		}
	}

	// 2. g0 back.
	f.reviveAll(g0)
	storms.Wait(t, 15*time.Second, "g0 storm ended", func(s dispatch.Storm) bool {
		return s.Group == "g0" && s.State == alarm.StormEnded
	})
	testenv.WaitFor(t, 10*time.Second, "the g0 alarm resolved", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Resolved) })
	testenv.WaitFor(t, 10*time.Second, "100 recovered events of g0", func() bool {
		return len(recovered.Bodies(func(ev dispatch.Recovered) bool { return strings.HasPrefix(ev.Device, "d0-") && ev.Group == "g0" })) == 100
	})
	time.Sleep(hold + time.Second)
	if n := deviceAlarms(alarms, g0); n != 0 {
		t.Errorf("%d device alarm notifications for g0, want 0", n)
	}
	if as := scopeAlarms(alarms, "g0"); len(as) < 2 || as[0].State != alarm.Raised || as[len(as)-1].State != alarm.Resolved {
		t.Errorf("g0 alarm: %s, want raised ... resolved", show(as))
	}

	// 3. 30% of the fleet, across groups.
	var wide []string
	for g := range 10 {
		from := 5 // past g1's silent five
		wide = append(wide, f.groups[g][from:from+30]...)
	}
	f.silenceAll(wide)
	storms.Wait(t, 20*time.Second, "a fleet storm", func(s dispatch.Storm) bool {
		return s.Scope == dispatch.ScopeFleet && s.State == alarm.StormStarted
	})
	testenv.WaitFor(t, 10*time.Second, "the fleet alarm raised", func() bool { return hasScopeAlarm(alarms, "", alarm.Raised) })
	testenv.WaitFor(t, 20*time.Second, "300 lost events", func() bool { return len(lostOf(lost, wide)) == 300 })
	time.Sleep(hold + time.Second)
	if n := deviceAlarms(alarms, wide); n != 0 {
		t.Errorf("%d device alarm notifications during the fleet storm, want 0", n)
	}
	if n := len(stormsOf(storms, dispatch.ScopeFleet, "", alarm.StormStarted)); n != 1 {
		t.Errorf("%d fleet storms started, want 1", n)
	}
	for g := 1; g < 10; g++ {
		if s := storms.Bodies(func(s dispatch.Storm) bool { return s.Group == fmt.Sprintf("g%d", g) }); len(s) > 0 {
			t.Errorf("group g%d had storm events %+v, want none (30%% of it is below the group fraction)", g, s)
		}
	}
	out, err = runCLI(t, addr, "storm", "ls", "--json")
	var sl api.StormList
	if err != nil || json.Unmarshal([]byte(out), &sl) != nil || len(sl.Storms) != 2 || sl.Storms[0].Scope != dispatch.ScopeFleet ||
		sl.Storms[0].State != alarm.StormActive || sl.Storms[1].Group != "g0" || sl.Storms[1].State != alarm.StormOver {
		t.Errorf("storm ls --json: want the active fleet storm, then g0's ended one: %v\n%s", err, out)
	}
	checkStoredOnce(t, env)
	for id, n := range storms.MsgIDs() {
		if n != 1 {
			t.Errorf("storm event %s stored %d times", id, n)
		}
	}
}

// TestStormSurvivesKills runs three alarm replicas (a full process and two
// alarm-only ones) while group g0 goes dark and comes back, and kills
// replicas with -9 around both transitions: every transition makes one
// notification of each kind, stored once, and no device alarm.
func TestStormSurvivesKills(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold, hold = time.Second, 2 * time.Second
	cfg := append([]string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(), "SIGWATCH_STORM_HOLD=" + hold.String(),
		"SIGWATCH_ALARM_INTERVAL=2s", "SIGWATCH_SCANNER_LEASE_TTL=1s", "SIGWATCH_ALARM_ACK_WAIT=2s",
		// The killed ingest's successor waits out its MQTT client id claim
		// (3s): that gap must be an outage, not silence of every group.
		"SIGWATCH_INGEST_OUTAGE_AFTER=500ms",
		"SIGWATCH_LOG_LEVEL=info"}, groupedConfig...)
	full := func(name string) *proc { return startProc(t, env, name, cfg...) }
	worker := func(name string) *proc { return startProc(t, env, name, append(cfg, "SIGWATCH_ROLES=alarm")...) }
	f0 := full("full-1")
	w1, w2 := worker("alarm-1"), worker("alarm-2")
	alarms := watchAlarms(t, env)
	storms := watchStorms(t, env)
	f := startGroupedFleet(t, env.Mosquitto.URL, 6, 50, 300*time.Millisecond) // g0 is a sixth: no fleet storm
	time.Sleep(3 * time.Second)

	killAround := func(at time.Duration) {
		time.Sleep(at + time.Duration(rand.IntN(600))*time.Millisecond)
		w1.kill()
		w1 = worker("alarm-1b")
		time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond)
		w2.kill()
		w2 = worker("alarm-2b")
	}
	g0 := f.groups[0]
	f.silenceAll(g0)
	killAround(threshold) // as the losses are handled
	f0.kill()
	full("full-2")
	storms.Wait(t, 20*time.Second, "g0 storm started", func(s dispatch.Storm) bool { return s.Group == "g0" && s.State == alarm.StormStarted })
	testenv.WaitFor(t, 15*time.Second, "the g0 alarm repeating", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Repeat) })

	f.reviveAll(g0)
	killAround(200 * time.Millisecond) // as the recoveries are handled
	storms.Wait(t, 20*time.Second, "g0 storm ended", func(s dispatch.Storm) bool { return s.Group == "g0" && s.State == alarm.StormEnded })
	testenv.WaitFor(t, 15*time.Second, "the g0 alarm resolved", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Resolved) })
	checkOneStorm(t, env, storms, alarms, g0, hold)
	for id, n := range storms.MsgIDs() {
		if n != 1 {
			t.Errorf("storm event %s stored %d times", id, n)
		}
	}
}

// checkOneStorm checks, once g0's storm has ended and a hold has passed,
// that it made one storm (started, ended), one scope alarm with a valid
// sequence and no device alarm, and stored every notification once.
func checkOneStorm(t *testing.T, env *testenv.Env, storms *stormLog, alarms *alarmLog, g0 []string, hold time.Duration) {
	t.Helper()
	time.Sleep(hold + time.Second)

	for _, state := range []string{alarm.StormStarted, alarm.StormEnded} {
		if n := len(stormsOf(storms, dispatch.ScopeGroup, "g0", state)); n != 1 {
			t.Errorf("%d g0 storm %s events, want 1", n, state)
		}
	}
	if n := storms.Len(); n != 2 {
		t.Errorf("%d storm events, want 2: %+v", n, storms.Bodies(nil))
	}
	as := scopeAlarms(alarms, "g0")
	if err := alarmSequence(as); err != nil {
		t.Errorf("g0 alarm: %v: %s", err, show(as))
	}
	if n := deviceAlarms(alarms, g0); n != 0 {
		t.Errorf("%d device alarm notifications for g0, want 0", n)
	}
	checkStoredOnce(t, env)
}

// waitCounted waits until the API at addr counts n devices watched.
func waitCounted(t *testing.T, addr string, n int64) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%d devices watched", n), func() bool {
		out, err := runCLI(t, addr, "stats", "--json")
		var s api.Stats
		return err == nil && json.Unmarshal([]byte(out), &s) == nil && s.Watched == n
	})
}
