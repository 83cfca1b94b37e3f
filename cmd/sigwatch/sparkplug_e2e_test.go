package main

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/sparkplug"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestSparkplugNodeDeathIsOneStorm: a Sparkplug B edge node with 50
// devices reporting by exception. While the node lives no device is lost,
// however long it stays quiet (the threshold is 2 s). Killing the node's
// connection gives its NDEATH will: the node and its 50 devices lost with
// reason death within keep-alive x 1.5 + fire lag, one group storm, one
// group alarm and no device alarm. Its rebirth brings all 51 back; a stale
// NDEATH (the old bdSeq) changes nothing; a DDEATH declares one device
// lost; malformed payloads go to sigwatch.invalid.
func TestSparkplugNodeDeathIsOneStorm(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	p := startProc(t, env, "sigwatch", "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_THRESHOLDS_DEFAULT=2s",
		"SIGWATCH_MQTT_SPARKPLUG_ENABLED=true", "SIGWATCH_ALARM_INTERVAL=500ms")
	lost := watchLost(t, env)
	recovered := testenv.RecordStream[dispatch.Recovered](t, env.Conn(t), "SIGWATCH", "sigwatch.recovered.>")
	invalid := testenv.RecordStream[dispatch.Invalid](t, env.Conn(t), "SIGWATCH", "sigwatch.invalid")
	storms := watchStorms(t, env)
	alarms := watchAlarms(t, env)
	waitAPI(t, addr)
	// A live plain fleet beside the node, so that its death is its group's
	// storm and not the whole fleet's.
	startDevices(t, env.Mosquitto.URL, 300, 500*time.Millisecond)

	const keepAlive = time.Second
	devs := make([]string, 50)
	ids := []string{"plant/edge1"}
	for j := range devs {
		devs[j] = fmt.Sprintf("d%02d", j)
		ids = append(ids, "plant/edge1/"+devs[j])
	}
	node := testenv.NewEdgeNode(t, env.Mosquitto.URL, "plant", "edge1", devs, keepAlive)
	testenv.WaitFor(t, 20*time.Second, "the node and its 50 devices watched", func() bool {
		for _, id := range ids {
			if _, v := getDevice(t, addr, url.PathEscape(id)); !v.Watched || v.Group != "plant/edge1" {
				return false
			}
		}
		return true
	})
	node.Data(devs[0])
	ours := func(l dispatch.Lost) bool { return strings.HasPrefix(l.Device, "plant/") }
	testenv.Never(t, 4*time.Second, "a device of a live node lost", func() bool { return len(lost.Where(ours)) > 0 })

	killed := time.Now()
	node.Kill()
	evs := lost.WaitN(t, 10*time.Second, 51, "the node and its 50 devices lost", ours)
	var worst time.Duration
	for _, ev := range evs {
		if ev.Body.Reason != shard.ReasonDeath {
			t.Errorf("%s lost with reason %q, want death", ev.Body.Device, ev.Body.Reason)
		}
		worst = max(worst, ev.At.Sub(killed))
	}
	t.Logf("51 lost events within %v of the kill", worst.Round(time.Millisecond))
	if worst > keepAlive*3/2+time.Second {
		t.Errorf("slowest lost event %v after the kill; want within keep-alive x 1.5 + 1 s", worst)
	}
	storms.Wait(t, 10*time.Second, "the group storm", func(s dispatch.Storm) bool {
		return s.Scope == dispatch.ScopeGroup && s.Group == "plant/edge1" && s.State == alarm.StormStarted
	})
	testenv.WaitFor(t, 10*time.Second, "the group alarm raised", func() bool { return hasScopeAlarm(alarms, "plant/edge1", alarm.Raised) })
	// The hold (the window: the 2 s threshold) passes with the devices
	// still lost: their alarms stay held.
	time.Sleep(3 * time.Second)
	if n := len(stormsOf(storms, dispatch.ScopeGroup, "plant/edge1", alarm.StormStarted)); n != 1 {
		t.Errorf("%d group storms started, want 1", n)
	}
	if n := len(storms.Bodies(func(s dispatch.Storm) bool { return s.Scope == dispatch.ScopeFleet })); n != 0 {
		t.Errorf("%d fleet storm events; the fleet is alive", n)
	}
	if n := deviceAlarms(alarms, ids); n != 0 {
		t.Errorf("%d device alarm notifications for the node's devices, want 0", n)
	}
	if n := len(lost.Where(func(l dispatch.Lost) bool { return !ours(l) })); n != 0 {
		t.Errorf("%d devices of the live fleet lost", n)
	}

	old := node.BdSeq()
	node.Rebirth()
	recovered.WaitN(t, 10*time.Second, 51, "the node and its devices recovered", func(r dispatch.Recovered) bool {
		return strings.HasPrefix(r.Device, "plant/")
	})
	node.PublishStaleDeath(old)
	testenv.Never(t, 3*time.Second, "a stale NDEATH declared anything", func() bool { return len(lost.Where(ours)) > 51 })

	ddeath := time.Now()
	node.DeviceDeath(devs[7])
	ev := lost.Wait(t, 5*time.Second, "d07 lost by its DDEATH", func(l dispatch.Lost) bool {
		return l.Device == "plant/edge1/d07" && l.FiredAt >= ddeath.UnixMilli()
	})
	if ev.Body.Reason != shard.ReasonDeath {
		t.Errorf("d07: reason %q, want death", ev.Body.Reason)
	}
	if n := len(lost.Where(ours)); n != 52 {
		t.Errorf("%d lost events of the node, want 51 + 1", n)
	}

	c := connectMQTT(t, env.Mosquitto.URL, "garbage")
	c.Publish("spBv1.0/plant/DDATA/edge1/d01", 1, false, []byte{0xff, 0x01, 0x02}).Wait()
	c.Publish("spBv1.0/plant/NBIRTH/edge2", 1, false, []byte("not protobuf")).Wait()
	invalid.WaitN(t, 10*time.Second, 2, "malformed Sparkplug refused", func(i dispatch.Invalid) bool {
		return strings.HasPrefix(i.Reason, "bad_sparkplug")
	})
	// They stalled nothing.
	node.DeviceDeath(devs[8])
	lost.Wait(t, 5*time.Second, "d08 lost after the garbage", func(l dispatch.Lost) bool { return l.Device == "plant/edge1/d08" })

	// sigwatch is a host application: its STATE is online, retained, and
	// its will says offline when it dies.
	states := make(chan []byte, 4)
	c.Subscribe("spBv1.0/STATE/sigwatch", 1, func(_ mqtt.Client, m mqtt.Message) { states <- m.Payload() })
	if online, _, err := sparkplug.DecodeState(<-states); err != nil || !online {
		t.Errorf("retained host STATE: online %v, %v; want online", online, err)
	}
	p.kill()
	select {
	case b := <-states:
		if online, _, err := sparkplug.DecodeState(b); err != nil || online {
			t.Errorf("host STATE after sigwatch was killed: online %v, %v; want its will, offline", online, err)
		}
	case <-time.After(10 * time.Second):
		t.Error("no offline host STATE after sigwatch was killed")
	}
}

// TestSparkplugSurvivesRedisEmpty: Redis restarts empty under a live
// Sparkplug node whose devices report by exception. The restore re-arms
// them until further notice, so none is taken for dead by a threshold it
// never keeps (2 s here). The node's bdSeq went with Redis: its next death
// is ignored, as a death of an unknown birth; once born again, its death
// declares it and its devices lost as before.
func TestSparkplugSurvivesRedisEmpty(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	startProc(t, env, "sigwatch", "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_THRESHOLDS_DEFAULT=2s",
		"SIGWATCH_MQTT_SPARKPLUG_ENABLED=true", "SIGWATCH_STORM_ENABLED=false")
	lost := watchLost(t, env)
	system := testenv.RecordStream[dispatch.System](t, env.Conn(t), "SIGWATCH", "sigwatch.system")
	waitAPI(t, addr)
	devs := []string{"a", "b", "c", "d", "e"}
	node := testenv.NewEdgeNode(t, env.Mosquitto.URL, "site", "n1", devs, time.Second)
	testenv.WaitFor(t, 20*time.Second, "the node and its devices watched", func() bool {
		for _, d := range devs {
			if _, v := getDevice(t, addr, url.PathEscape("site/n1/"+d)); !v.Watched {
				return false
			}
		}
		return true
	})
	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	system.Wait(t, 60*time.Second, "the restore", func(s dispatch.System) bool { return s.Kind == "redis_restored" })
	ours := func(l dispatch.Lost) bool { return strings.HasPrefix(l.Device, "site/") }
	testenv.Never(t, 5*time.Second, "a quiet Sparkplug device lost after the restore", func() bool { return len(lost.Where(ours)) > 0 })

	node.Rebirth()
	testenv.WaitFor(t, 10*time.Second, "the rebirth recorded", func() bool {
		_, v := getDevice(t, addr, url.PathEscape("site/n1"))
		return v.Watched && v.Deadline > time.Now().Add(time.Hour).UnixMilli()
	})
	node.Kill()
	evs := lost.WaitN(t, 10*time.Second, 6, "the node and its devices lost after the rebirth", ours)
	for _, ev := range evs {
		if ev.Body.Reason != shard.ReasonDeath {
			t.Errorf("%s lost with reason %q, want death", ev.Body.Device, ev.Body.Reason)
		}
	}
}

// TestSparkplugScanRateMakesDataPeriodic: a node that says in its NBIRTH
// that it scans every second is periodic, with its devices: each message
// keeps them alive for three scans. A device whose data goes on is never
// lost; one whose data stops is lost 3 s after its last message, with
// reason declared, though the node lives and the threshold is an hour.
func TestSparkplugScanRateMakesDataPeriodic(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	startProc(t, env, "sigwatch", "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_THRESHOLDS_DEFAULT=1h",
		"SIGWATCH_MQTT_SPARKPLUG_ENABLED=true", "SIGWATCH_STORM_ENABLED=false")
	lost := watchLost(t, env)
	waitAPI(t, addr)
	node := testenv.NewScanningEdgeNode(t, env.Mosquitto.URL, "line", "n1", []string{"busy", "stops"}, 5*time.Second, time.Second)
	testenv.WaitFor(t, 20*time.Second, "the node's devices watched", func() bool {
		_, a := getDevice(t, addr, url.PathEscape("line/n1/busy"))
		_, b := getDevice(t, addr, url.PathEscape("line/n1/stops"))
		return a.Watched && b.Watched && a.Deadline < time.Now().Add(time.Minute).UnixMilli()
	})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				node.Data("busy")
				node.NodeData()
				if n < 4 {
					node.Data("stops")
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()
	ev := lost.Wait(t, 10*time.Second, "stops lost", func(l dispatch.Lost) bool { return l.Device == "line/n1/stops" })
	if ev.Body.Reason != shard.ReasonDeclared {
		t.Errorf("stops lost with reason %q, want declared", ev.Body.Reason)
	}
	if silent := ev.Body.Deadline - ev.Body.LastSeen; silent != 3000 {
		t.Errorf("stops lost %d ms after its last message, want three scans, 3000", silent)
	}
	testenv.Never(t, 3*time.Second, "a device or node with data going on lost", func() bool {
		return len(lost.Where(func(l dispatch.Lost) bool { return l.Device != "line/n1/stops" })) > 0
	})
}
