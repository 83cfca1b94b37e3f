package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// Broker blips (guarantee 6 of docs/guarantees.md): losing the broker is an outage from
// the moment the connection is lost, whatever its length, and after a
// broker restart devices get ingest.reconnect_grace to come back before
// their silence counts again.
const (
	blipThreshold = 2 * time.Second
	// blipGrace covers the devices' reconnection (at most blipJitter
	// apart) with room for a loaded machine: 600 clients reconnecting at
	// once can take seconds to all be back (4s at a load of 12 on two
	// cores; 5s left a live device 3.7s).
	blipGrace = 7 * time.Second
	// blipJitter is how long a device waits before each reconnection
	// attempt, at most.
	blipJitter = time.Second
	// blipLag is how long past the outage rule's bound a blip is watched
	// for live devices reported lost before the next one.
	blipLag = 1500 * time.Millisecond
	// blipFireLag is how long after its deadline a lost event may be
	// fired: the race-built sigwatch's speed on a loaded machine. Where
	// the deadline was put is checked exactly.
	blipFireLag = 5 * time.Second
)

// blipBroker is the broker a blip test kills and restarts.
type blipBroker struct {
	url     string
	kill    func()
	restart func() error
}

// TestBrokerBlipLosesNoLiveDevice kills the broker (kill -9: Mosquitto, or a
// nats-server with its MQTT listener, each its own process) and restarts it after 0.3 s,
// 1 s, 2 s and 5 s, under 600 devices that signal every 300 ms on
// connections of their own and reconnect with up to 1 s of jitter. No
// device that kept signalling is reported lost (the bug: hundreds were
// after a blip shorter than ingest.outage_after); devices silenced just
// before each crash are reported once, never early, and a threshold after
// the grace ends at the latest. With two processes in a shared group, with
// one process consuming alone, and on the NATS MQTT listener.
func TestBrokerBlipLosesNoLiveDevice(t *testing.T) {
	for _, c := range []struct {
		name  string
		procs int
		group string
		nats  bool
	}{
		{"shared", 2, "sigwatch", false},
		{"single", 1, "", false},
		{"nats-mqtt", 1, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := testenv.New(t, testenv.Options{Mosquitto: !c.nats, NATS: true})
			b := blipBroker{}
			if c.nats {
				n, err := servers.StartNATSProcess(filepath.Join(t.TempDir(), "mqtt"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(n.Stop)
				b = blipBroker{url: n.MQTTURL, kill: func() { _ = n.Kill() }, restart: n.Restart}
			} else {
				m := env.Mosquitto
				b = blipBroker{url: m.URL, kill: func() { _ = m.Kill() }, restart: m.Restart}
			}
			brokerBlips(t, env, b, c.procs, c.group)
		})
	}
}

func brokerBlips(t *testing.T, env *testenv.Env, b blipBroker, procs int, group string) {
	settings := []string{
		"SIGWATCH_MQTT_BROKERS=" + b.url,
		"SIGWATCH_THRESHOLDS_DEFAULT=" + blipThreshold.String(),
		"SIGWATCH_INGEST_RECONNECT_GRACE=" + blipGrace.String(),
		"SIGWATCH_MQTT_SHARED_GROUP=" + group,
		"SIGWATCH_LOG_LEVEL=info",
	}
	addr := freeAddr(t)
	for i := range procs {
		s := append(settings, fmt.Sprintf("SIGWATCH_MQTT_CLIENT_ID=sigwatch-%d", i))
		if i == 0 {
			s = append(s, "SIGWATCH_HTTP_ADDR="+addr)
		}
		startProc(t, env, fmt.Sprintf("p%d", i), s...)
	}
	lost := watchLost(t, env)
	f := startJitterFleet(t, b.url, 600, 300*time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "every device signalling", f.allSignalled)
	time.Sleep(blipThreshold)

	ends := map[string]int64{} // silenced device -> the end of the outage its deadline fell in
	next := 0
	for _, down := range []time.Duration{300 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second} {
		// Devices that go silent just before the crash: their deadlines
		// fall inside the blip, and they must still be reported.
		var silenced []string
		for range 10 {
			id := f.ids[next*7]
			next++
			f.silence(id)
			silenced = append(silenced, id)
		}
		time.Sleep(50 * time.Millisecond)
		killed := time.Now()
		b.kill()
		time.Sleep(down)
		if err := b.restart(); err != nil {
			t.Fatal(err)
		}
		up := time.Now()
		t.Logf("broker down for %v", up.Sub(killed).Round(time.Millisecond))
		// Devices reconnect, sigwatch reconnects, the grace runs, then a
		// threshold: anything falsely lost shows by then.
		o := blipOver(t, lost, f, addr, killed)
		back, who := f.backWithin(up)
		t.Logf("every live device connected again within %v of the broker's return (the last %s); sigwatch's grace began %v after it",
			back.Round(time.Millisecond), who, time.UnixMilli(o.GraceFrom).Sub(up).Round(time.Millisecond))
		// The grace runs to the outage's end, or into a longer outage (ingest
		// slow to consume again after the broker's return).
		if got := time.Duration(o.End-o.GraceFrom) * time.Millisecond; o.GraceFrom == 0 || got < blipGrace {
			t.Errorf("the outage of a broker down %v: %+v, want a reconnect grace of %v", down, o, blipGrace)
		}
		for _, id := range silenced {
			ends[id] = o.End
		}
	}
	checkLostByOutageEnd(t, lost, f.devices, addr, ends)
}

// blipOver watches, while live devices go on signalling, until the outage
// that began with the broker's loss at killed is recorded and a threshold
// has passed since its end (anything falsely lost shows by then), and
// returns that outage. A live device reported lost fails the test at once.
func blipOver(t *testing.T, lost *lostLog, f *jitterFleet, addr string, killed time.Time) blipOutage {
	t.Helper()
	d := f.devices
	var (
		o, seen  blipOutage
		read     time.Time
		statsErr error
	)
	testenv.WaitFor(t, 60*time.Second, "the broker's outage recorded and a threshold past its end", func() bool {
		silenced := d.silenced()
		for _, ev := range lost.Bodies(nil) {
			if _, ok := silenced[ev.Device]; !ok {
				d.mu.Lock()
				last := d.last[ev.Device]
				d.mu.Unlock()
				f.connMu.Lock()
				up := f.connected[ev.Device]
				f.connMu.Unlock()
				t.Fatalf("live device %s reported lost: %+v; its last acknowledged signal at %d, its connection up since %d (broker killed at %d)",
					ev.Device, ev, last.UnixMilli(), up.UnixMilli(), killed.UnixMilli())
			}
		}
		if o.End == 0 && time.Since(read) > 200*time.Millisecond {
			read = time.Now()
			st, err := blipStats(addr)
			if statsErr = err; err != nil {
				t.Logf("GET /v1/stats: %v", err)
			}
			for _, x := range st.Watermark.Outages {
				seen = x
				// The previous blip's outage ended before this one began.
				if x.End > killed.UnixMilli() {
					o = x
				}
			}
		}
		return o.End != 0 && time.Now().After(time.UnixMilli(o.End).Add(blipThreshold+blipLag))
	})
	if o.End == 0 {
		t.Logf("no outage after the kill at %d; the latest seen %+v (stats: %v)", killed.UnixMilli(), seen, statsErr)
	}
	return o
}

// TestOwnConnectionCutNoGrace cuts sigwatch's own connection to a broker
// that stays up (a proxy between them drops it and refuses it for 1.5 s)
// while the broker keeps its persistent session and the devices' signals:
// the gap is an outage, but not a broker restart, so no reconnect grace is
// applied. Devices silenced just before the cut are reported within the
// outage rule's bound (the grace is set to 30 s: applying it would show),
// and no live device is reported lost.
func TestOwnConnectionCutNoGrace(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	proxy := testenv.NewProxy(t, env.Mosquitto.Addr)
	addr := freeAddr(t)
	startProc(t, env, "sigwatch",
		"SIGWATCH_MQTT_BROKERS=tcp://"+proxy.Addr,
		"SIGWATCH_THRESHOLDS_DEFAULT="+blipThreshold.String(),
		"SIGWATCH_INGEST_RECONNECT_GRACE=30s",
		"SIGWATCH_MQTT_SHARED_GROUP=",
		"SIGWATCH_HTTP_ADDR="+addr,
		"SIGWATCH_LOG_LEVEL=info")
	lost := watchLost(t, env)
	f := startJitterFleet(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "every device signalling", f.allSignalled)
	time.Sleep(blipThreshold)

	ends := map[string]int64{}
	for round := range 2 {
		var silenced []string
		for i := range 10 {
			id := f.ids[round*50+i*3]
			f.silence(id)
			silenced = append(silenced, id)
		}
		time.Sleep(50 * time.Millisecond)
		cut := time.Now()
		proxy.Cut(1500 * time.Millisecond)
		o := blipOver(t, lost, f, addr, cut)
		if o.GraceFrom != 0 {
			t.Errorf("outage %+v has a reconnect grace; want none for a cut of sigwatch's own connection", o)
		}
		for _, id := range silenced {
			ends[id] = o.End
		}
	}
	checkLostByOutageEnd(t, lost, f.devices, addr, ends)
}

// checkLostByOutageEnd waits for every silenced device's lost event and
// checks that each is reported once, never early, at a deadline at most a
// threshold after the end of the outage its first deadline fell in,
// ends[device] (the outage rule's bound, with the grace the outage holds),
// and within blipFireLag of that deadline.
// A deadline so deferred may fall in the next outage, which defers it again:
// that outage begins where the broker's deliveries had reached, which after
// a restart can be seconds before the next kill. The chain is followed
// through the outages sigwatch recorded (GET /v1/stats on addr).
func checkLostByOutageEnd(t *testing.T, lost *lostLog, d *devices, addr string, ends map[string]int64) {
	t.Helper()
	waitAllLost(t, lost, d, 20*time.Second)
	checkExactlySilenced(t, lost, d, blipThreshold)
	st, err := blipStats(addr)
	if err != nil {
		t.Fatalf("GET /v1/stats: %v", err)
	}
	outages := st.Watermark.Outages
	for id, evs := range byDevice(lost) {
		end := deferredEnd(ends[id], blipThreshold, outages)
		if end != ends[id] {
			t.Logf("device %s: its deferred deadline fell in a later outage, which ended %v after the first",
				id, time.Duration(end-ends[id])*time.Millisecond)
		}
		latest := time.UnixMilli(end).Add(blipThreshold)
		for _, ev := range evs {
			if dl := time.UnixMilli(ev.Deadline); dl.After(latest) {
				t.Errorf("device %s lost at a deadline %v after its outage ended, want at most a threshold after (%v); outages recorded: %+v",
					id, dl.Sub(time.UnixMilli(end)).Round(time.Millisecond), blipThreshold, outages)
			}
			if lag := time.Duration(ev.FiredAt-ev.Deadline) * time.Millisecond; lag > blipFireLag {
				t.Errorf("device %s reported lost %v after its deadline, want within %v", id, lag, blipFireLag)
			}
		}
	}
}

// deferredEnd returns the end of the last outage in the outage rule's chain
// from one that ends at end: the deadline it defers to, a threshold after,
// is deferred again by any outage that overlaps the silence before it.
func deferredEnd(end int64, threshold time.Duration, outages []blipOutage) int64 {
	for changed := true; changed; {
		changed = false
		due := end + threshold.Milliseconds()
		for _, o := range outages {
			if o.Start < due && o.End > due-threshold.Milliseconds() && o.End > end {
				end, changed = o.End, true
			}
		}
	}
	return end
}

// blipOutages is the part of GET /v1/stats the blip tests read.
type blipOutages struct {
	Watermark struct {
		OutagesTotal int64        `json:"outages_total"`
		Outages      []blipOutage `json:"outages"`
	} `json:"watermark"`
}

type blipOutage struct {
	Start     int64 `json:"start"`
	End       int64 `json:"end"`
	GraceFrom int64 `json:"grace_from"`
}

func blipStats(addr string) (blipOutages, error) {
	var v blipOutages
	resp, err := http.Get("http://" + addr + "/v1/stats")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return v, fmt.Errorf("%s: %s", resp.Status, b)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// jitterFleet is a fleet whose devices each have a connection of their
// own, as real devices do: when it is lost, each waits up to blipJitter
// before every reconnection attempt.
type jitterFleet struct {
	*devices
	connMu    sync.Mutex
	connected map[string]time.Time // device -> when its connection last came up; guarded by connMu
}

// backWithin returns how long after since the last live device's
// connection came up, and that device.
func (f *jitterFleet) backWithin(since time.Time) (time.Duration, string) {
	silenced := f.silenced()
	f.connMu.Lock()
	defer f.connMu.Unlock()
	var (
		worst time.Duration
		who   string
	)
	for id, at := range f.connected {
		if _, ok := silenced[id]; !ok && at.Sub(since) > worst {
			worst, who = at.Sub(since), id
		}
	}
	return worst, who
}

func startJitterFleet(t *testing.T, broker string, n int, period time.Duration) *jitterFleet {
	t.Helper()
	d := &devices{t: t, period: period, silentAt: map[string]time.Time{}, last: map[string]time.Time{}}
	for i := range n {
		d.ids = append(d.ids, fmt.Sprintf("blip-%04d", i))
	}
	f := &jitterFleet{devices: d, connected: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, id := range d.ids {
		wg.Go(func() { runJitterDevice(ctx, f, broker, id, uint64(i)) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f
}

func (f *jitterFleet) allSignalled() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.last) == len(f.ids)
}

// runJitterDevice connects, signals every period while it is not silenced,
// and reconnects after a random wait when its connection is gone. It does
// not wait for one signal's acknowledgement before the next, as a device
// with an in-flight window does not: a broker slow to acknowledge after its
// restart must not make the device signal less often than it does.
func runJitterDevice(ctx context.Context, f *jitterFleet, broker, id string, seed uint64) {
	d := f.devices
	rng := rand.New(rand.NewPCG(seed, 42))
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID(id).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectTimeout(time.Second).SetKeepAlive(5 * time.Second).SetOrderMatters(false).
		// Without a write timeout a Publish made as the connection dies
		// blocks until the next connection, which this loop never makes.
		SetWriteTimeout(time.Second))
	var acks sync.WaitGroup
	defer acks.Wait()
	defer c.Disconnect(0)
	// Devices start spread over a period.
	tick := time.NewTimer(time.Duration(rng.Int64N(int64(d.period))))
	defer tick.Stop()
	wait := func(dur time.Duration) bool {
		tick.Reset(dur)
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
			return true
		}
	}
	if !wait(0) {
		return
	}
	up := false
	for {
		if !c.IsConnectionOpen() {
			if up {
				// The connection is gone: wait before reconnecting.
				up = false
				if !wait(time.Duration(rng.Int64N(int64(blipJitter)))) {
					return
				}
				continue
			}
			if tok := c.Connect(); !tok.WaitTimeout(2*time.Second) || tok.Error() != nil {
				c.Disconnect(0) // an attempt still under way ends before the next
				if !wait(time.Duration(rng.Int64N(int64(blipJitter)))) {
					return
				}
				continue
			}
			up = true
			f.connMu.Lock()
			f.connected[id] = time.Now()
			f.connMu.Unlock()
		}
		d.mu.Lock()
		_, silent := d.silentAt[id]
		d.mu.Unlock()
		if !silent {
			sent := time.Now()
			tok := c.Publish("devices/"+id+"/signal", 1, false, []byte{})
			acks.Go(func() {
				if tok.WaitTimeout(10*time.Second) && tok.Error() == nil {
					d.mu.Lock()
					if sent.After(d.last[id]) {
						d.last[id] = sent
					}
					d.mu.Unlock()
				}
			})
		}
		if !wait(d.period) {
			return
		}
	}
}
