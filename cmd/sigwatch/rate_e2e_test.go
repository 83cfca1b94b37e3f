package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sigwatch/sigwatch/alarm"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// scrapedLateness returns the least bucket bound of
// sigwatch_alarm_notification_lateness_seconds at addr's /metrics that holds
// every observation, and how many there were.
func scrapedLateness(t *testing.T, addr string) (time.Duration, uint64) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	mf, ok := mfs["sigwatch_alarm_notification_lateness_seconds"]
	if !ok || len(mf.GetMetric()) != 1 {
		t.Errorf("scrape %s: no sigwatch_alarm_notification_lateness_seconds", addr)
		return 0, 0
	}
	h := mf.GetMetric()[0].GetHistogram()
	var dist []string
	for _, b := range h.GetBucket() {
		dist = append(dist, fmt.Sprintf("<=%gs:%d", b.GetUpperBound(), b.GetCumulativeCount()))
	}
	t.Logf("%s: notification_lateness_seconds %s of %d", addr, strings.Join(dist, " "), h.GetSampleCount())
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() == h.GetSampleCount() {
			return time.Duration(b.GetUpperBound() * float64(time.Second)), h.GetSampleCount()
		}
	}
	return time.Hour, h.GetSampleCount()
}

// TestRateLimitPacesAStorm proves alarm.rate with real processes: 200 of
// 1100 devices (below a fifth of the fleet) go silent at once, and with
// SIGWATCH_ALARM_RATE=10 on both alarm replicas (a full process and an
// alarm worker) every one of them is raised exactly once, at most 10 a
// second by the stream's timestamps (one more only when timer jitter puts
// it there, measured: see checkPacedE2E), their slots spread over 19.9s.
func TestRateLimitPacesAStorm(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const (
		rate      = 10
		threshold = 3 * time.Second
		n, silent = 1100, 200
	)
	var addrs []string
	for range 2 {
		port, err := servers.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
	}
	cfg := []string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(), "SIGWATCH_ALARM_INTERVAL=10m",
		fmt.Sprintf("SIGWATCH_ALARM_RATE=%d", rate), "SIGWATCH_LOG_LEVEL=info"}
	startProc(t, env, "full", append(cfg, "SIGWATCH_HTTP_ADDR="+addrs[0])...)
	startProc(t, env, "alarm", append(cfg, "SIGWATCH_HTTP_ADDR="+addrs[1], "SIGWATCH_ROLES=alarm,api")...)
	for _, a := range addrs {
		waitHTTP(t, a, "/readyz", 20*time.Second)
	}
	d := startDevices(t, env.Mosquitto.URL, n, time.Second)
	l := watchAlarms(t, env)
	// Every device seen (and so watched) before the storm.
	time.Sleep(2500 * time.Millisecond)
	start := time.Now()
	gone := map[string]bool{}
	for _, id := range d.ids[:silent] {
		d.silence(id)
		gone[id] = true
	}
	testenv.WaitFor(t, 45*time.Second, fmt.Sprintf("%d raised", silent), func() bool {
		return len(l.Where(func(a dispatch.Alarm) bool { return a.State == alarm.Raised })) >= silent
	})
	t.Logf("%d raised %v after the storm began", silent, time.Since(start).Round(time.Millisecond))

	var times []time.Time
	perDevice := map[string]int{}
	for _, m := range testenv.StreamMessages(t, env.Conn(t), "SIGWATCH", "sigwatch.alarm.") {
		var a dispatch.Alarm
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Fatalf("notification %s: %v", m.Data, err)
		}
		if a.State != alarm.Raised || !gone[a.Device] {
			t.Errorf("notification %s/%s of %s, want only raised of the silenced devices", a.State, a.Reason, a.Device)
			continue
		}
		perDevice[a.Device]++
		times = append(times, m.Time)
	}
	for id := range gone {
		if perDevice[id] != 1 {
			t.Errorf("device %s raised %d times, want once", id, perDevice[id])
		}
	}
	checkStoredOnce(t, env)

	var late time.Duration
	var observed uint64
	for _, a := range addrs {
		l, k := scrapedLateness(t, a)
		late, observed = max(late, l), observed+k
	}
	if observed < silent {
		t.Errorf("notification_lateness_seconds observed %d times across the replicas, want %d", observed, silent)
	}
	checkPacedE2E(t, times, rate, late, time.Duration(silent-1)*time.Second/rate)
}

// checkPacedE2E checks stream times against the rate as alarm's
// checkPaced does: slots are T = alarm.Spacing(rate) apart and each note is
// stored within late after its slot, so a second of stream times holds at
// most ceil((1s+late)/T) notes: rate while late stays within 100 ms.
func checkPacedE2E(t *testing.T, times []time.Time, rate int, late, span time.Duration) {
	t.Helper()
	T := alarm.Spacing(float64(rate))
	allowed := int((time.Second + late + T - 1) / T)
	most, at := testenv.MaxInWindow(times, time.Second)
	if most > allowed {
		t.Errorf("%d raised stored in the second from %s, want at most %d (%d a second, stored up to %v after their slots)",
			most, at.Format("15:04:05.000"), allowed, rate, late)
	}
	first, last := times[0], times[0]
	for _, x := range times {
		if x.Before(first) {
			first = x
		}
		if x.After(last) {
			last = x
		}
	}
	// The slots span at least span; stored, the first may be up to late
	// after its slot and the last on time.
	if last.Sub(first) < span-late {
		t.Errorf("%d raised stored over %v, want at least %v less %v", len(times), last.Sub(first), span, late)
	}
	t.Logf("%d raised over %v, at most %d in a second; stored within %v of their slots", len(times), last.Sub(first), most, late)
}
