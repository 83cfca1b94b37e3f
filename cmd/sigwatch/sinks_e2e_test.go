package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/webhooks"
)

// sinkRig is a sigwatch process with a webhook and a PagerDuty sink.
type sinkRig struct {
	addr string
	hook *testenv.WebhookReceiver
	pd   *testenv.PagerDuty
}

func startSinkRig(t *testing.T, env *testenv.Env, extra ...string) (*sinkRig, *proc) {
	t.Helper()
	sec := webhooks.NewSecret()
	r := &sinkRig{addr: freeAddr(t), hook: testenv.NewWebhookReceiver(t, sec), pd: testenv.NewPagerDuty(t, testenv.PagerDutyOptions{})}
	conf := filepath.Join(t.TempDir(), "sigwatch.yaml")
	yaml := fmt.Sprintf(`sinks:
  - {name: hook, type: webhook, url_env: HOOK_URL, secrets_env: [HOOK_SECRET], rate: 100}
  - {name: oncall, type: pagerduty, url: %q, routing_key_env: PD_KEY}
`, r.pd.URL())
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, env, "sigwatch", append([]string{"SIGWATCH_CONFIG=" + conf, "SIGWATCH_HTTP_ADDR=" + r.addr,
		"HOOK_URL=" + r.hook.URL() + "/hook", "HOOK_SECRET=" + sec.Reveal(), "PD_KEY=routing-key-1",
		"SIGWATCH_THRESHOLDS_DEFAULT=2s", "SIGWATCH_STORM_HOLD=5s", "SIGWATCH_STORM_FLEET_MIN=1000000"}, extra...)...)
	waitAPI(t, r.addr)
	return r, p
}

// signal posts one signal for each device, in group (if any).
func (r *sinkRig) signal(t *testing.T, group string, ids ...string) {
	t.Helper()
	type sig struct {
		Device string `json:"device"`
		Group  string `json:"group,omitempty"`
	}
	var body []sig
	for _, id := range ids {
		body = append(body, sig{id, group})
	}
	if code, out := apiCall(t, http.MethodPost, r.addr, "/v1/signals", "", body); code != http.StatusOK {
		t.Fatalf("signals: %d %s", code, out)
	}
}

// alarmCalls are the webhook's alarm deliveries (not storm events).
func (r *sinkRig) alarmCalls() []map[string]any {
	var out []map[string]any
	for _, d := range r.hook.Deliveries() {
		var m map[string]any
		if json.Unmarshal(d.Body, &m) == nil && m["scope"] == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestSinksCarryRealAlarms: a device's alarm reaches a webhook and
// PagerDuty (trigger, then resolve when it comes back); 1,000 devices of a
// gateway going dark together are one call each: one group alarm, no
// device alarm, one PagerDuty trigger listing them.
func TestSinksCarryRealAlarms(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	r, _ := startSinkRig(t, env)

	r.signal(t, "", "solo")
	// The hold (storm.hold) is long enough for a gateway's losses to make
	// their storm even on a loaded machine, where its alarm workers take
	// seconds over a thousand lost events.
	testenv.WaitFor(t, 30*time.Second, "solo's raised alarm on both sinks", func() bool {
		return len(r.alarmCalls()) >= 1 && len(r.pd.Events()) >= 1
	})
	if a := r.alarmCalls()[0]; a["device"] != "solo" || a["state"] != "raised" {
		t.Fatalf("first alarm call %v, want solo raised", a)
	}
	if e := r.pd.Events()[0]; e.EventAction != "trigger" || !strings.HasPrefix(e.DedupKey, "solo@") {
		t.Fatalf("first PagerDuty event %+v, want a trigger keyed by solo's alarm", e)
	}
	r.signal(t, "", "solo")
	testenv.WaitFor(t, 20*time.Second, "solo's resolve", func() bool {
		ev := r.pd.Events()
		return len(ev) >= 2 && ev[len(ev)-1].EventAction == "resolve"
	})
	// solo is watched no more: it would be lost again.
	if code, out := apiCall(t, http.MethodDelete, r.addr, "/v1/devices/solo", "", nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("delete solo: %d %s", code, out)
	}

	const n = 1000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("gw-dev-%04d", i)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			r.signal(t, "gw", ids...)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	time.Sleep(2 * time.Second)
	before := len(r.pd.Events())
	close(stop)
	wg.Wait()
	testenv.WaitFor(t, 30*time.Second, "the group's one trigger", func() bool { return len(r.pd.Events()) > before })
	time.Sleep(7 * time.Second) // anything more would come by now: the hold is 5 s
	pd := r.pd.Events()[before:]
	if len(pd) != 1 || pd[0].EventAction != "trigger" || pd[0].Payload == nil {
		t.Fatalf("PagerDuty got %d events for a 1,000-device storm, want one trigger: %+v", len(pd), pd)
	}
	// The storm's devices lost when the alarm went out: at least half the
	// group (storm.group_fraction), the rest following within moments.
	if got, _ := pd[0].Payload.CustomDetails["lost_devices"].(float64); got < n/2 || got > n {
		t.Errorf("the trigger's lost_devices = %v, want %d to %d", got, n/2, n)
	}
	var group, devices int
	for _, a := range r.alarmCalls() {
		switch {
		case a["device"] == "" && a["group"] == "gw":
			group++
		case strings.HasPrefix(fmt.Sprint(a["device"]), "gw-dev-"):
			devices++
		}
	}
	if group != 1 || devices != 0 {
		t.Errorf("webhook alarm calls: %d for the group, %d for its devices; want 1 and 0", group, devices)
	}
	if d := r.hook.Duplicates(); len(d) > 0 {
		t.Errorf("webhook ids delivered twice: %v", d)
	}
}

// TestSinkDeliveryAcrossKill: sigwatch killed -9 while a paced sink
// delivers 40 alarms loses none: after the restart every alarm reaches the
// webhook, each id once but for at most the one in hand at the kill,
// which is sent again with the same webhook-id.
func TestSinkDeliveryAcrossKill(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	sec := webhooks.NewSecret()
	hook := testenv.NewWebhookReceiver(t, sec)
	conf := filepath.Join(t.TempDir(), "sigwatch.yaml")
	if err := os.WriteFile(conf, []byte("sinks:\n  - {name: hook, type: webhook, url_env: HOOK_URL, secrets_env: [HOOK_SECRET], rate: 5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	settings := []string{"SIGWATCH_CONFIG=" + conf, "SIGWATCH_HTTP_ADDR=" + addr, "HOOK_URL=" + hook.URL() + "/hook",
		"HOOK_SECRET=" + sec.Reveal(), "SIGWATCH_THRESHOLDS_DEFAULT=2s", "SIGWATCH_STORM_ENABLED=false", "SIGWATCH_ALARM_ACK_WAIT=3s"}
	p := startProc(t, env, "sigwatch", settings...)
	waitAPI(t, addr)
	r := &sinkRig{addr: addr}
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = fmt.Sprintf("k-%02d", i)
	}
	r.signal(t, "", ids...)
	testenv.WaitFor(t, 20*time.Second, "some alarms delivered", func() bool { return len(hook.Deliveries()) >= 10 })
	p.kill()
	killed := len(hook.Deliveries())
	startProc(t, env, "sigwatch-2", append(settings, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-e2e-2")...)
	testenv.WaitFor(t, 60*time.Second, "every alarm delivered", func() bool {
		seen := map[string]bool{}
		for _, d := range hook.Deliveries() {
			seen[d.ID] = true
		}
		return len(seen) >= len(ids)
	})
	if killed >= len(ids) {
		t.Fatalf("all %d delivered before the kill: the test needs a slower sink", killed)
	}
	if d := hook.Duplicates(); len(d) > 1 {
		t.Errorf("ids delivered twice: %v; at most the one in hand at the kill may be", d)
	}
	t.Logf("%d of %d delivered before the kill; duplicates %v", killed, len(ids), hook.Duplicates())
}
