package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestRedisRestartedEmpty kills Redis (no persistence) under a live fleet
// after two doublings, with some silenced devices already lost and alarmed
// and some silenced just before the crash, and starts it again empty.
func TestRedisRestartedEmpty(t *testing.T) { redisLoss(t, false) }

// TestRedisEverySecKilled is the same with appendonly yes, appendfsync
// everysec: Redis comes back with up to its last second lost.
func TestRedisEverySecKilled(t *testing.T) { redisLoss(t, true) }

// redisLoss checks invariant 10 end to end: every silenced device is
// reported lost exactly once (the not-yet-lost ones within threshold +
// lease + a few seconds of Redis being back), no live device is, nothing
// recovers falsely, the lost devices' alarms go on repeating without a
// second raise, the topology after the doublings is kept, the loss is
// told on sigwatch.system, and the service is ready again.
func redisLoss(t *testing.T, persist bool) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true, RedisPersist: persist})
	const (
		threshold = 3 * time.Second
		lease     = 2 * time.Second
		interval  = 2 * time.Second
	)
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT="+threshold.String(), "SIGWATCH_SHARDS_INITIAL=4",
		"SIGWATCH_ALARM_INTERVAL="+interval.String(), "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_SCANNER_LEASE_TTL="+lease.String())
	conn := env.Conn(t)
	lost := watchLost(t, env)
	alarms := testenv.RecordStream[dispatch.Alarm](t, conn, "SIGWATCH", "sigwatch.alarm.>")
	recovered := testenv.RecordStream[dispatch.Recovered](t, conn, "SIGWATCH", "sigwatch.recovered.>")
	system := testenv.RecordStream[dispatch.System](t, conn, "SIGWATCH", "sigwatch.system")
	d := startDevices(t, env.Mosquitto.URL, 500, 300*time.Millisecond)
	waitHTTP(t, addr, "/readyz", 20*time.Second)

	for _, want := range []string{"4 -> 8", "8 -> 16"} {
		testenv.WaitFor(t, 60*time.Second, "doubling "+want, func() bool {
			cmd := exec.Command(binary, "shards", "double")
			cmd.Env = append(os.Environ(), "SIGWATCH_REDIS_ADDRS="+env.Redis.Addr)
			out, _ := cmd.CombinedOutput() // refused while the previous doubling drains
			return strings.Contains(string(out), want)
		})
	}
	time.Sleep(threshold)

	// A: silenced long before the crash: lost and alarmed before it.
	var early []string
	for i := 0; i < 20; i++ {
		id := d.ids[i*25]
		early = append(early, id)
		d.silence(id)
	}
	waitAllLost(t, lost, d, 20*time.Second)
	alarms.WaitN(t, 10*time.Second, len(early), "the early devices' alarms raised", func(a dispatch.Alarm) bool { return a.State == "raised" })
	// B: silenced just before the crash: not lost yet when Redis dies.
	for i := 0; i < 20; i++ {
		d.silence(d.ids[i*25+1])
	}
	time.Sleep(500 * time.Millisecond)
	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()

	waitAllLost(t, lost, d, threshold+lease+20*time.Second)
	for _, e := range lost.Events() {
		if e.At.After(back) {
			if late := e.At.Sub(back); late > threshold+lease+5*time.Second {
				t.Errorf("device %s reported %v after Redis was back, want within threshold + lease + 5s", e.Body.Device, late)
			}
		}
	}
	// The early devices' alarms repeat after the loss, with no second raise.
	testenv.WaitFor(t, 3*interval+10*time.Second, "the early devices' alarms repeating after the loss", func() bool {
		repeated := map[string]bool{}
		for _, e := range alarms.Events() {
			if e.At.After(back) && e.Body.State == "repeat" {
				repeated[e.Body.Device] = true
			}
		}
		for _, id := range early {
			if !repeated[id] {
				return false
			}
		}
		return true
	})
	neverLiveLost(t, lost, d, 2*threshold)
	checkExactlySilenced(t, lost, d, threshold)
	raised := map[string]int{}
	for _, a := range alarms.Bodies(nil) {
		if a.State == "raised" {
			raised[a.Device]++
		}
	}
	for id, n := range raised {
		if n != 1 {
			t.Errorf("device %s's alarm raised %d times, want once", id, n)
		}
	}
	if n := recovered.Len(); n != 0 {
		t.Errorf("%d recovered events, want none (no silenced device came back): %+v", n, recovered.Bodies(nil))
	}
	kinds := map[string]int{}
	for _, ev := range system.Bodies(nil) {
		kinds[ev.Kind]++
	}
	if kinds["redis_data_loss"] == 0 || kinds["redis_restored"] == 0 {
		t.Errorf("system events %v, want redis_data_loss and redis_restored", kinds)
	}
	var v shardsView
	if err := json.Unmarshal([]byte(waitHTTP(t, addr, "/v1/shards", 10*time.Second)), &v); err != nil {
		t.Fatal(err)
	}
	if v.Shards != 16 {
		t.Errorf("after the loss the topology has %d shards, want the 16 of the two doublings", v.Shards)
	}
	waitHTTP(t, addr, "/readyz", 10*time.Second)
	t.Logf("lost %d, alarms %d, system events %v", lost.Len(), alarms.Len(), kinds)
}

// waitHTTP waits until GET path on addr answers 200 and returns the body.
func waitHTTP(t *testing.T, addr, path string, timeout time.Duration) string {
	t.Helper()
	var body string
	testenv.WaitFor(t, timeout, "GET "+path+" answering 200", func() bool {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	})
	return body
}
