package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestStormEndsWhenItsDevicesRoam runs 200 devices in 4 gateways of 50.
// Gateway g0 goes dark: one storm, one g0 alarm. Its devices then come
// back under the other gateways: half by topic (they publish under g1, g2
// or g3), half through the API (their group is set with PUT
// /v1/devices/{id}/group, and they signal over POST /v1/signals). The g0
// storm ends and its alarm resolves, though no device is left in g0;
// GET /v1/storms shows it ended; every group's membership is exactly its
// devices; and a roamed device that then goes silent alone gets an alarm
// of its own (a storm left active would hold it for good).
func TestStormEndsWhenItsDevicesRoam(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	const threshold, hold = 2 * time.Second, 2 * time.Second
	startProc(t, env, "sigwatch", append([]string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(),
		"SIGWATCH_STORM_HOLD=" + hold.String(), "SIGWATCH_ALARM_INTERVAL=3s", "SIGWATCH_HTTP_ADDR=" + addr,
		"SIGWATCH_LOG_LEVEL=info"}, groupedConfig...)...)
	alarms := watchAlarms(t, env)
	storms := watchStorms(t, env)
	f := startGroupedFleet(t, env.Mosquitto.URL, 4, 50, 500*time.Millisecond)
	store := env.Store(t, "sw")
	testenv.WaitFor(t, 30*time.Second, "the 4 gateways watched", func() bool {
		for g := range 4 {
			if n, err := store.GroupSize(t.Context(), fmt.Sprint("g", g)); err != nil || n != 50 {
				return false
			}
		}
		return true
	})

	f.silenceAll(f.groups[0])
	testenv.WaitFor(t, 20*time.Second, "the g0 storm and its alarm", func() bool {
		return len(stormsOf(storms, dispatch.ScopeGroup, "g0", alarm.StormStarted)) == 1 && hasScopeAlarm(alarms, "g0", alarm.Raised)
	})

	// They come back under the other gateways.
	want := map[string]int64{"g0": 0, "g1": 50, "g2": 50, "g3": 50}
	var (
		mu  sync.Mutex
		api []string // devices that now signal over the API
	)
	for k, topicID := range f.groups[0] {
		id := deviceOf(topicID)
		g := fmt.Sprint("g", 1+k%3)
		want[g]++
		if k%2 == 0 {
			f.mu.Lock()
			f.ids = append(f.ids, g+"/"+id)
			f.mu.Unlock()
			continue
		}
		if code, out := apiCall(t, "PUT", addr, "/v1/devices/"+id+"/group", "", map[string]string{"group": g}); code != http.StatusOK {
			t.Fatalf("PUT group of %s: %d %s", id, code, out)
		}
		mu.Lock()
		api = append(api, id)
		mu.Unlock()
	}
	signalEvery(t, "http://"+addr, "", func() []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		var b []map[string]any
		for _, id := range api {
			b = append(b, map[string]any{"device": id})
		}
		return b
	})
	testenv.WaitFor(t, 20*time.Second, "the g0 storm ended and its alarm resolved", func() bool {
		return len(stormsOf(storms, dispatch.ScopeGroup, "g0", alarm.StormEnded)) == 1 && hasScopeAlarm(alarms, "g0", alarm.Resolved)
	})
	code, out := apiCall(t, "GET", addr, "/v1/storms", "", nil)
	if code != http.StatusOK || !containsAll(out, `"group":"g0"`, `"state":"ended"`) || containsAll(out, `"state":"active"`) {
		t.Errorf("GET /v1/storms: %d %s; want the g0 storm ended and none active", code, out)
	}
	testenv.WaitFor(t, 10*time.Second, "every group's membership exact", func() bool {
		for g, n := range want {
			if got, err := store.GroupSize(t.Context(), g); err != nil || got != n {
				return false
			}
		}
		return true
	})
	// The storm is over: a roamed device silent alone is alarmed as usual.
	alone := f.groups[0][0] // roamed by topic to g1
	f.silence("g1/" + deviceOf(alone))
	testenv.WaitFor(t, 20*time.Second, "an alarm for a roamed device lost alone", func() bool {
		return hasAlarm(alarms, deviceOf(alone), alarm.Raised, "")
	})
	g0 := scopeAlarms(alarms, "g0")
	if last := g0[len(g0)-1]; last.State != alarm.Resolved {
		t.Errorf("the g0 alarm went on after it resolved: %+v", g0)
	}
}

// containsAll reports whether s holds every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
