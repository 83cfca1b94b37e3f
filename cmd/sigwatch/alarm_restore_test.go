package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestRestoreTwentyThousandAlarms: two processes, 20,000 lost devices with
// open alarms in the durable registry, and Redis restarted empty: one
// process restores (one redis_data_loss, one redis_restored event), and
// every alarm is back in its state.
func TestRestoreTwentyThousandAlarms(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	var addrs []string
	for p := range 2 {
		port, err := servers.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
		startProc(t, env, fmt.Sprintf("sigwatch-%d", p), "SIGWATCH_HTTP_ADDR="+addrs[p],
			"SIGWATCH_THRESHOLDS_DEFAULT=1m", "SIGWATCH_ALARM_INTERVAL=1h", "SIGWATCH_LOG_LEVEL=info",
			fmt.Sprintf("SIGWATCH_MQTT_CLIENT_ID=sigwatch-e2e-%d", p))
	}
	for _, addr := range addrs {
		waitHTTP(t, addr, "/readyz", 30*time.Second)
	}
	system := testenv.RecordStream[dispatch.System](t, env.Conn(t), "SIGWATCH", "sigwatch.system")

	// The registry holds 20,000 lost devices, each alarm repeated twice.
	const n = 20_000
	ctx := t.Context()
	pub, err := dispatch.New(ctx, env.Conn(t), dispatch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := pub.OpenRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	lostAt := now - 10*60_000
	recs := make([]dispatch.DeviceRecord, n)
	for k := range recs {
		raw, _ := json.Marshal(alarm.State{Version: 4, Phase: alarm.Active, Since: lostAt, Deadline: lostAt, Count: 2,
			Next: now + time.Hour.Milliseconds(), Last: alarm.Repeat, At: now - 60_000})
		recs[k] = dispatch.DeviceRecord{ID: fmt.Sprintf("r-%05d", k), LostDeadline: lostAt, LostAt: lostAt + 5, Alarm: string(raw)}
	}
	for _, err := range reg.Add(ctx, recs, func(*dispatch.DeviceRecord, bool) (bool, bool) { return false, false }) {
		if err != nil {
			t.Fatal(err)
		}
	}

	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	ev := system.Wait(t, 60*time.Second, "redis_restored", func(ev dispatch.System) bool { return ev.Kind == "redis_restored" }).Body
	t.Logf("restore done %v after Redis came back empty; it reports %v", time.Since(back).Round(time.Millisecond), ev.Details)
	if got, _ := ev.Details["alarms"].(float64); got != n {
		t.Errorf("the restore put back %v alarms, want %d", ev.Details["alarms"], n)
	}
	for _, addr := range addrs {
		waitHTTP(t, addr, "/readyz", 30*time.Second)
	}
	time.Sleep(2 * time.Second) // a second restore would have begun
	for _, kind := range []string{"redis_data_loss", "redis_restored"} {
		if got := system.Bodies(func(ev dispatch.System) bool { return ev.Kind == kind }); len(got) != 1 {
			t.Errorf("%d %s events, want 1", len(got), kind)
		}
	}

	// Every alarm is back, active, as repeated before.
	seen := map[string]bool{}
	cursor := ""
	for {
		q := url.Values{"state": {"active"}, "limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		resp, err := http.Get("http://" + addrs[1] + "/v1/alarms?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var page api.AlarmList
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatalf("GET /v1/alarms: %v: %s", err, b)
		}
		for _, a := range page.Alarms {
			if a.Since != lostAt || a.Count != 2 {
				t.Errorf("alarm of %s back as %+v, want active since %d with 2 repeats", a.Device, a, lostAt)
			}
			seen[a.Device] = true
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	if len(seen) != n {
		t.Errorf("%d alarms active after the restore, want %d", len(seen), n)
	}
}
