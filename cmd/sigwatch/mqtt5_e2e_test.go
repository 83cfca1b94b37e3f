package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestDeclaredInUserProperties: with mqtt.protocol 5, a device may declare
// its deadline in MQTT 5 user properties ttd and next, as in the payload:
// ttd 2 fires at 2 s with reason declared, next fires at its time, -1
// holds until ttd 0 fires at once, a bad value is refused to
// sigwatch.invalid, and a payload's declaration wins over a property's.
func TestDeclaredInUserProperties(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	addr := freeAddr(t)
	startProc(t, env, "sigwatch", append([]string{"SIGWATCH_HTTP_ADDR=" + addr, "SIGWATCH_MQTT_PROTOCOL=5",
		"SIGWATCH_THRESHOLDS_MAX_DECLARED=1h"}, presenceEnv...)...)
	lost := watchLost(t, env)
	invalid := testenv.RecordStream[dispatch.Invalid](t, env.Conn(t), "SIGWATCH", "sigwatch.invalid")
	waitAPI(t, addr)
	c := testenv.MQTT5(t, env.Mosquitto.URL, "props-fleet")
	send := func(id, payload string, props ...string) time.Time {
		t.Helper()
		at := time.Now()
		testenv.Publish5(t, c, "devices/"+id+"/signal", []byte(payload), props...)
		return at
	}

	const n = 200
	sent := map[string]time.Time{}
	for i := range n {
		id := fmt.Sprintf("prop-ttd2-%d", i)
		sent[id] = send(id, "", "ttd", "2")
	}
	next := time.Now().Add(3 * time.Second)
	send("prop-next", "", "next", strconv.FormatInt(next.UnixMilli(), 10))
	send("prop-forever", "", "ttd", "-1")
	send("prop-payload-wins", `{"ttd": 600}`, "ttd", "2")
	send("prop-bad", "", "ttd", "soon")
	plain := send("prop-plain", "")

	evs := lost.WaitN(t, 30*time.Second, n, "200 devices with ttd 2 in a user property lost", func(l dispatch.Lost) bool {
		return strings.HasPrefix(l.Device, "prop-ttd2-")
	})
	var worst time.Duration
	for _, ev := range evs {
		since := ev.At.Sub(sent[ev.Body.Device])
		if ev.Body.Reason != shard.ReasonDeclared || since < 2*time.Second {
			t.Fatalf("%s lost %v after its message with reason %q; want at 2 s or later, declared", ev.Body.Device, since, ev.Body.Reason)
		}
		worst = max(worst, since)
	}
	t.Logf("200 devices with a ttd 2 user property: reported within %v of their message", worst.Round(time.Millisecond))
	if worst > 10*time.Second {
		t.Errorf("slowest reported %v after its message; want 2 s and the fire lag, far from the 5m threshold", worst)
	}
	ev := lost.Wait(t, 15*time.Second, "the device with next lost", func(l dispatch.Lost) bool { return l.Device == "prop-next" })
	if ev.Body.Deadline != next.UnixMilli() || ev.Body.Reason != shard.ReasonDeclared {
		t.Errorf("next: lost at deadline %d with reason %q; want %d, declared", ev.Body.Deadline, ev.Body.Reason, next.UnixMilli())
	}
	invalid.Wait(t, 10*time.Second, "the bad ttd property refused", func(i dispatch.Invalid) bool { return i.Reason == "bad_ttd" })

	if _, v := getDevice(t, addr, "prop-payload-wins"); time.Until(time.UnixMilli(v.Deadline)) < 9*time.Minute {
		t.Errorf("payload ttd 600 with a ttd 2 property: deadline %v away; want the payload's 10m", time.Until(time.UnixMilli(v.Deadline)))
	}
	// The 5m threshold, not a declaration (a stamp may be capped a little
	// earlier than the receipt under load: the outage rule).
	if _, v := getDevice(t, addr, "prop-plain"); time.UnixMilli(v.Deadline).Sub(plain) < 4*time.Minute || time.UnixMilli(v.Deadline).Sub(plain) > 5*time.Minute+5*time.Second {
		t.Errorf("a device without a declaration: deadline %v after its message; want the 5m threshold", time.UnixMilli(v.Deadline).Sub(plain))
	}
	if got := lost.Where(func(l dispatch.Lost) bool { return l.Device == "prop-forever" || l.Device == "prop-bad" }); len(got) > 0 {
		t.Fatalf("lost %v; want neither the ttd -1 device nor the refused one", got)
	}
	gone := send("prop-forever", "", "ttd", "0")
	ev = lost.Wait(t, 10*time.Second, "prop-forever lost after ttd 0", func(l dispatch.Lost) bool { return l.Device == "prop-forever" })
	if ev.Body.Reason != shard.ReasonDeclared || ev.At.Sub(gone) > 2*time.Second {
		t.Errorf("ttd 0: reason %q after %v; want declared at once", ev.Body.Reason, ev.At.Sub(gone))
	}
}
