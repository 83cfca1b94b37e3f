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

	"github.com/sigwatch/sigwatch/api"
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
	r := startLossRun(t, env, "SIGWATCH_SHARDS_INITIAL=4")
	for _, want := range []string{"4 -> 8", "8 -> 16"} {
		testenv.WaitFor(t, 60*time.Second, "doubling "+want, func() bool {
			cmd := exec.Command(binary, "shards", "double", "--config", redisConfig(t, env))
			out, _ := cmd.CombinedOutput() // refused while the previous doubling drains
			return strings.Contains(string(out), want)
		})
	}
	r.silence()
	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	r.check(time.Now(), 16, !persist)
	if persist {
		// appendfsync everysec acknowledges writes before they are on disk:
		// its restart is never taken for a clean one.
		b, _ := os.ReadFile(r.proc.log)
		if strings.Contains(string(b), cleanVerdict) {
			t.Error("a restart of Redis with appendfsync everysec after SIGKILL was taken for a clean one")
		}
		if !strings.Contains(string(b), "did not write every write to its append-only file before acknowledging it") {
			t.Error("the restore's reason does not say the restart was not proven whole")
		}
	}
}

// lossRun is one sigwatch process watching a live fleet while Redis loses
// data under it, with what it published recorded.
type lossRun struct {
	t         *testing.T
	addr      string // the process's HTTP API
	lost      *lostLog
	alarms    *testenv.Recorder[dispatch.Alarm]
	recovered *testenv.Recorder[dispatch.Recovered]
	system    *testenv.Recorder[dispatch.System]
	d         *devices
	proc      *proc
	early     []string // silenced and reported lost before the loss
}

const (
	lossThreshold = 3 * time.Second
	lossLease     = 2 * time.Second
	lossInterval  = 2 * time.Second // alarm repeats
)

// startLossRun starts sigwatch (with extra settings) and a 500-device
// fleet, and waits until the process is ready.
func startLossRun(t *testing.T, env *testenv.Env, extra ...string) *lossRun {
	return startLossFleet(t, env, 500, 300*time.Millisecond, extra...)
}

// startLossFleet is startLossRun with n devices signalling every period.
func startLossFleet(t *testing.T, env *testenv.Env, n int, period time.Duration, extra ...string) *lossRun {
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	r := &lossRun{t: t, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	r.proc = startProc(t, env, "sigwatch", append([]string{"SIGWATCH_THRESHOLDS_DEFAULT=" + lossThreshold.String(),
		"SIGWATCH_ALARM_INTERVAL=" + lossInterval.String(), "SIGWATCH_HTTP_ADDR=" + r.addr,
		"SIGWATCH_SCANNER_LEASE_TTL=" + lossLease.String()}, extra...)...)
	conn := env.Conn(t)
	r.lost = watchLost(t, env)
	r.alarms = testenv.RecordStream[dispatch.Alarm](t, conn, "SIGWATCH", "sigwatch.alarm.>")
	r.recovered = testenv.RecordStream[dispatch.Recovered](t, conn, "SIGWATCH", "sigwatch.recovered.>")
	r.system = testenv.RecordStream[dispatch.System](t, conn, "SIGWATCH", "sigwatch.system")
	r.d = startDevices(t, env.Mosquitto.URL, n, period)
	waitHTTP(t, r.addr, "/readyz", 30*time.Second)
	return r
}

// silence silences 20 devices and waits until they are lost and alarmed,
// then silences 20 more, which are not lost yet when it returns.
func (r *lossRun) silence() {
	t, d := r.t, r.d
	time.Sleep(lossThreshold)
	for i := 0; i < 20; i++ {
		id := d.ids[i*25]
		r.early = append(r.early, id)
		d.silence(id)
	}
	waitAllLost(t, r.lost, d, 20*time.Second)
	r.alarms.WaitN(t, 10*time.Second, len(r.early), "the early devices' alarms raised", func(a dispatch.Alarm) bool { return a.State == "raised" })
	for i := 0; i < 20; i++ {
		d.silence(d.ids[i*25+1])
	}
	time.Sleep(500 * time.Millisecond)
}

// check waits for and checks the outcome of a loss that ended at back; the
// topology must have wantShards. With lossCertain (Redis came back empty)
// the loss must be told on sigwatch.system; otherwise the restore's check
// against the registry judges, and says which it found: a loss told on
// sigwatch.system, or nothing missing in the log.
func (r *lossRun) check(back time.Time, wantShards int, lossCertain bool) {
	t, d := r.t, r.d
	waitAllLost(t, r.lost, d, lossThreshold+lossLease+20*time.Second)
	for _, e := range r.lost.Events() {
		if late := e.At.Sub(back); e.At.After(back) && late > lossThreshold+lossLease+5*time.Second {
			t.Errorf("device %s reported %v after Redis was back, want within threshold + lease + 5s", e.Body.Device, late)
		}
	}
	// The early devices' alarms repeat after the loss, with no second raise.
	testenv.WaitFor(t, 3*lossInterval+10*time.Second, "the early devices' alarms repeating after the loss", func() bool {
		repeated := map[string]bool{}
		for _, e := range r.alarms.Events() {
			if e.At.After(back) && e.Body.State == "repeat" {
				repeated[e.Body.Device] = true
			}
		}
		for _, id := range r.early {
			if !repeated[id] {
				return false
			}
		}
		return true
	})
	neverLiveLost(t, r.lost, d, 2*lossThreshold)
	checkExactlySilenced(t, r.lost, d, lossThreshold)
	raised := map[string]int{}
	for _, a := range r.alarms.Bodies(nil) {
		if a.State == "raised" {
			raised[a.Device]++
		}
	}
	for id, n := range raised {
		if n != 1 {
			t.Errorf("device %s's alarm raised %d times, want once", id, n)
		}
	}
	if n := r.recovered.Len(); n != 0 {
		t.Errorf("%d recovered events, want none (no silenced device came back): %+v", n, r.recovered.Bodies(nil))
	}
	kinds := map[string]int{}
	for _, ev := range r.system.Bodies(nil) {
		kinds[ev.Kind]++
	}
	told := kinds["redis_data_loss"] > 0 && kinds["redis_restored"] > 0
	if !told && !lossCertain {
		b, _ := os.ReadFile(r.proc.log)
		told = strings.Contains(string(b), `level=INFO msg="Redis restarted; checked against the registry: nothing missing"`)
	}
	if !told {
		t.Errorf("system events %v, want redis_data_loss and redis_restored", kinds)
	}
	var v api.Shards
	if err := json.Unmarshal([]byte(waitHTTP(t, r.addr, "/v1/shards", 10*time.Second)), &v); err != nil {
		t.Fatal(err)
	}
	if v.Shards != wantShards {
		t.Errorf("after the loss the topology has %d shards, want %d", v.Shards, wantShards)
	}
	waitHTTP(t, r.addr, "/readyz", 10*time.Second)
	t.Logf("lost %d, alarms %d, system events %v", r.lost.Len(), r.alarms.Len(), kinds)
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
