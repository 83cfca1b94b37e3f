package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/stats"
)

// statsJSON is the shape of GET /v1/stats, written out here so that a
// change of the contract the status page reads fails this test.
type statsJSON struct {
	At      int64 `json:"at"`
	Watched int64 `json:"watched"`
	Lost    int64 `json:"lost"`
	Alarms  *struct {
		Active   int64 `json:"active"`
		Held     int64 `json:"held"`
		Acked    int64 `json:"acked"`
		Flapping int64 `json:"flapping"`
		Mutes    int64 `json:"mutes"`
	} `json:"alarms"`
	SignalsPerSec float64 `json:"signals_per_sec"`
	LostPerSec    float64 `json:"lost_per_sec"`
	LastMinute    struct {
		Signals   int64 `json:"signals"`
		Lost      int64 `json:"lost"`
		Recovered int64 `json:"recovered"`
		Invalid   int64 `json:"invalid"`
	} `json:"last_minute"`
	FireLag struct {
		P50   *float64 `json:"p50_ms"`
		P99   *float64 `json:"p99_ms"`
		Count int64    `json:"count"`
	} `json:"fire_lag"`
	Watermark struct {
		At           int64    `json:"at"`
		AgeMS        int64    `json:"age_ms"`
		Outage       bool     `json:"outage"`
		BrokerDown   []string `json:"broker_down"`
		GraceUntil   int64    `json:"grace_until"`
		OutagesTotal int64    `json:"outages_total"`
		Outages      []struct {
			Start     int64 `json:"start"`
			End       int64 `json:"end"`
			GraceFrom int64 `json:"grace_from"`
		} `json:"outages"`
	} `json:"watermark"`
	Shards struct {
		Count    int   `json:"count"`
		Prev     int   `json:"prev"`
		Epoch    int64 `json:"epoch"`
		Draining bool  `json:"draining"`
		Drain    struct {
			Draining        bool  `json:"draining"`
			From            int   `json:"from"`
			To              int   `json:"to"`
			Since           int64 `json:"since"`
			MovedLeft       int64 `json:"moved_left"`
			ShardsDrained   int   `json:"shards_drained"`
			ShardsUnchecked int   `json:"shards_unchecked"`
			Writers         []struct {
				Name    string `json:"name"`
				Epoch   int64  `json:"epoch"`
				AgeMS   int64  `json:"age_ms"`
				Current bool   `json:"current"`
				Gone    bool   `json:"gone"`
			} `json:"writers"`
		} `json:"drain"`
	} `json:"shards"`
	Processes []struct {
		Name  string   `json:"name"`
		Roles []string `json:"roles"`
		AgeMS int64    `json:"age_ms"`
	} `json:"processes"`
	History []struct {
		At            int64    `json:"at"`
		P50           *float64 `json:"p50_ms"`
		P99           *float64 `json:"p99_ms"`
		SignalsPerSec float64  `json:"signals_per_sec"`
		LostPerSec    float64  `json:"lost_per_sec"`
	} `json:"history"`
}

func getStats(t *testing.T, app *App) statsJSON {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+app.HTTPAddr()+"/v1/stats", nil)
	req.Header.Set("Authorization", "Bearer t0ken")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/stats: %d %s", resp.StatusCode, b)
	}
	var v statsJSON
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("GET /v1/stats: %v in %s", err, b)
	}
	return v
}

// offered counts the signals the broker delivers, as a subscriber of its
// own: the rate the fleet offers, measured apart from sigwatch.
type offered struct {
	mu sync.Mutex
	at []time.Time
}

func countOffered(t *testing.T, broker string) *offered {
	o := &offered{}
	var n atomic.Int64
	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(broker).SetClientID("stats-offered"))
	tok := c.Subscribe("devices/+/signal", 0, func(mqtt.Client, mqtt.Message) {
		n.Add(1)
		o.mu.Lock()
		o.at = append(o.at, time.Now())
		o.mu.Unlock()
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return o
}

// rate is the signals per second over the span before now.
func (o *offered) rate(span time.Duration) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	from := time.Now().Add(-span)
	n := 0
	for _, at := range o.at {
		if at.After(from) {
			n++
		}
	}
	return float64(n) / span.Seconds()
}

// TestStatsFleetWide runs three processes with different roles (api only;
// ingest and scanner; scanner and alarm) over a small fleet with silenced
// and recovered devices. The api-only process, which counts nothing
// itself, shows the fleet's numbers: watched and lost exactly, each loss of
// the last minute once though two scanners share the shards, signals/s
// close to what the broker delivers, fire lag quantiles that match the lost
// events, the alarm counts; a stopped process drops out, and a doubling
// shows with its drain.
func TestStatsFleetWide(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold = time.Second
	thr := "SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String()
	apiApp := startApp(t, env, func(c *Config) { c.Roles, c.Thresholds.Default = []string{"api"}, threshold })
	startProc(t, env, "ingest-scanner", thr, "SIGWATCH_ROLES=ingest,scanner")
	l := watchLost(t, env)
	o := countOffered(t, env.Mosquitto.URL)
	const n, period = 100, 200 * time.Millisecond
	d := startDevices(t, env.Mosquitto.URL, n, period)
	scanAlarm := startProc(t, env, "scanner-alarm", thr, "SIGWATCH_ROLES=scanner,alarm")

	testenv.WaitFor(t, 15*time.Second, "the whole fleet watched and three processes reporting", func() bool {
		v := getStats(t, apiApp)
		return v.Watched == n && len(v.Processes) == 3
	})
	const silenced, revived = 10, 3
	for i := range silenced {
		d.silence(d.ids[i])
	}
	testenv.WaitFor(t, 15*time.Second, "the silenced devices lost", func() bool { return len(byDevice(l)) == silenced })
	// The stats follow within a report and a cache period.
	var v statsJSON
	testenv.WaitFor(t, 5*time.Second, "the losses in the stats", func() bool {
		v = getStats(t, apiApp)
		return v.Lost == silenced && v.LastMinute.Lost >= silenced
	})
	// Two scanners fired them; each loss counts once, now and later.
	time.Sleep(2 * stats.ReportEvery)
	v = getStats(t, apiApp)
	if v.Watched != n-silenced || v.Lost != silenced {
		t.Errorf("watched %d, lost %d; want %d, %d", v.Watched, v.Lost, n-silenced, silenced)
	}
	if v.LastMinute.Lost != silenced || v.FireLag.Count != silenced {
		t.Errorf("lost in the last minute %d, fire lag count %d; want %d each (once across two scanners)",
			v.LastMinute.Lost, v.FireLag.Count, silenced)
	}
	// The scanners' histograms observe fired_at - deadline; their buckets
	// grow by a factor under 2.1, so a quantile read from them lies within
	// that factor of the events' own.
	var fired []float64
	for _, ev := range l.Bodies(nil) {
		fired = append(fired, float64(ev.FiredAt-ev.Deadline))
	}
	slices.Sort(fired)
	p50, p99 := fired[(len(fired)+1)/2-1], fired[len(fired)-1]
	near := func(got *float64, want float64) bool {
		return got != nil && *got >= want/2.1-1 && *got <= want*2.1+1
	}
	if !near(v.FireLag.P50, p50) || !near(v.FireLag.P99, p99) {
		t.Errorf("fire lag p50 %s ms, p99 %s ms; want within a bucket of the events' %.0f ms, %.0f ms",
			fmtMS(v.FireLag.P50), fmtMS(v.FireLag.P99), p50, p99)
	}
	t.Logf("stats: watched %d lost %d, last minute %+v, fire lag p50/p99 %s/%s ms over %d (events: %.0f/%.0f ms), %.1f signals/s (broker %.1f/s)",
		v.Watched, v.Lost, v.LastMinute, fmtMS(v.FireLag.P50), fmtMS(v.FireLag.P99), v.FireLag.Count, p50, p99,
		v.SignalsPerSec, o.rate(5*time.Second))
	if want := o.rate(5 * time.Second); v.SignalsPerSec < want*0.75 || v.SignalsPerSec > want*1.25 {
		t.Errorf("signals/s %.1f, want within 25%% of the %.1f/s the broker delivered", v.SignalsPerSec, want)
	}
	if v.LastMinute.Signals == 0 || v.Watermark.At == 0 || v.Watermark.AgeMS > 3000 || v.Watermark.Outage {
		t.Errorf("last minute signals %d, watermark %+v; want signals and a fresh watermark", v.LastMinute.Signals, v.Watermark)
	}
	for _, p := range v.Processes {
		if p.AgeMS > 5000 || len(p.Roles) == 0 {
			t.Errorf("process %+v: want a fresh report with roles", p)
		}
	}
	testenv.WaitFor(t, 20*time.Second, "the open alarms counted", func() bool {
		v := getStats(t, apiApp)
		return v.Alarms != nil && v.Alarms.Active == silenced
	})

	for i := range revived {
		d.revive(d.ids[i])
	}
	testenv.WaitFor(t, 10*time.Second, "the revived devices recovered", func() bool {
		v := getStats(t, apiApp)
		return v.LastMinute.Recovered == revived && v.Lost == silenced-revived && v.Watched == n-silenced+revived
	})

	// A process that dies drops out, its counts with it, once its last
	// report is too old.
	scanAlarm.kill()
	testenv.WaitFor(t, stats.ReportMaxAge+stats.CacheFor+2*stats.ReportEvery, "the dead process gone", func() bool {
		v = getStats(t, apiApp)
		return len(v.Processes) == 2
	})
	for _, p := range v.Processes {
		if slices.Contains(p.Roles, "alarm") {
			t.Errorf("stopped process %s still reported", p.Name)
		}
	}
	if v.Alarms != nil {
		t.Errorf("alarms %+v with no alarm role running, want null", *v.Alarms)
	}

	// A doubling shows, and so does the end of its drain.
	if code, out := call(t, apiApp, "POST", "/v1/shards/double", "t0ken", nil); code != http.StatusOK {
		t.Fatalf("double: %d %v", code, out)
	}
	testenv.WaitFor(t, 2*stats.CacheFor, "the doubling in the stats", func() bool {
		v = getStats(t, apiApp)
		return v.Shards.Count == 32
	})
	if v.Shards.Prev != 16 || !v.Shards.Draining || v.Shards.Drain.From != 16 || v.Shards.Drain.To != 32 {
		t.Errorf("after the doubling: shards %+v, want 32 from 16, draining", v.Shards)
	}
	if v.Watched < n-silenced+revived || v.Watched > n-silenced+revived+v.Shards.Drain.MovedLeft+n {
		t.Errorf("watched %d while draining, want at least %d", v.Watched, n-silenced+revived)
	}
	testenv.WaitFor(t, 20*time.Second, "the drain finished", func() bool {
		v := getStats(t, apiApp)
		return v.Shards.Count == 32 && v.Shards.Prev == 0 && !v.Shards.Draining
	})
	time.Sleep(stats.CacheFor)
	v = getStats(t, apiApp)
	if v.Watched != n-silenced+revived || v.Lost != silenced-revived {
		t.Errorf("after the doubling: watched %d, lost %d; want %d, %d", v.Watched, v.Lost, n-silenced+revived, silenced-revived)
	}
	if len(v.History) == 0 || v.History[len(v.History)-1].SignalsPerSec == 0 {
		t.Errorf("history %+v, want recent points with signals", v.History)
	}

	// The CLI shows the same through the API.
	out, err := runCLI(t, apiApp.HTTPAddr(), "stats", "--token", "t0ken")
	if want := fmt.Sprintf("watched %d  lost %d\n", n-silenced+revived, silenced-revived); err != nil || !strings.HasPrefix(out, want) {
		t.Errorf("sigwatch stats: %v\n%s\nwant it to start with %q", err, out, want)
	}
	out, err = runCLI(t, apiApp.HTTPAddr(), "stats", "--json", "--token", "t0ken")
	var cv statsJSON
	if err != nil || json.Unmarshal([]byte(out), &cv) != nil || cv.Shards.Count != 32 {
		t.Errorf("sigwatch stats --json: %v\n%s", err, out)
	}
}

func fmtMS(p *float64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'f', 1, 64)
}
