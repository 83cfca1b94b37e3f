package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestStormSurvivesRedisLoss: a 200-device gateway storm, and Redis
// restarted empty while it lasts. The storm, its scope alarm and the held
// device alarms come back from the durable registry: one storm started,
// one scope alarm (repeating on, then resolved once the gateway is back),
// no device alarm, and one storm ended.
func TestStormSurvivesRedisLoss(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	const threshold, hold, interval = 2 * time.Second, 2 * time.Second, 2 * time.Second
	startProc(t, env, "sigwatch", append([]string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(),
		"SIGWATCH_STORM_HOLD=" + hold.String(), "SIGWATCH_ALARM_INTERVAL=" + interval.String(),
		"SIGWATCH_SCANNER_LEASE_TTL=1s", "SIGWATCH_STORM_FLEET_FRACTION=0.5", "SIGWATCH_HTTP_ADDR=" + addr,
		"SIGWATCH_LOG_LEVEL=info"}, groupedConfig...)...)
	alarms := watchAlarms(t, env)
	storms := watchStorms(t, env)
	system := testenv.RecordStream[dispatch.System](t, env.Conn(t), "SIGWATCH", "sigwatch.system")
	f := startGroupedFleet(t, env.Mosquitto.URL, 3, 200, 600*time.Millisecond)
	waitCounted(t, addr, 600)
	time.Sleep(threshold)

	g0 := f.groups[0]
	f.silenceAll(g0)
	storms.Wait(t, 20*time.Second, "g0 storm started", func(s dispatch.Storm) bool {
		return s.Group == "g0" && s.State == alarm.StormStarted
	})
	testenv.WaitFor(t, 10*time.Second, "the g0 alarm raised", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Raised) })
	time.Sleep(hold + time.Second) // every g0 alarm held by the storm

	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	lossAt := time.Now()
	system.Wait(t, 30*time.Second, "redis_restored", func(ev dispatch.System) bool { return ev.Kind == "redis_restored" })
	t.Logf("restored %v after Redis came back empty", time.Since(lossAt).Round(time.Millisecond))
	restored := time.Now().UnixMilli()
	testenv.WaitFor(t, 4*interval, "the g0 alarm repeating after the restore", func() bool {
		for _, a := range scopeAlarms(alarms, "g0") {
			if a.State == alarm.Repeat && a.At > restored {
				return true
			}
		}
		return false
	})
	time.Sleep(hold + time.Second) // held alarms that lost their storm would be raised by now
	if n := deviceAlarms(alarms, g0); n != 0 {
		t.Errorf("%d device alarm notifications for g0 after the restore, want 0", n)
	}

	f.reviveAll(g0)
	storms.Wait(t, 20*time.Second, "g0 storm ended", func(s dispatch.Storm) bool { return s.Group == "g0" && s.State == alarm.StormEnded })
	testenv.WaitFor(t, 15*time.Second, "the g0 alarm resolved", func() bool { return hasScopeAlarm(alarms, "g0", alarm.Resolved) })
	checkOneStorm(t, env, storms, alarms, g0, hold)
}
