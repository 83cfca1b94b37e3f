package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestTimersSentinelFailoverToLaggedReplica runs sigwatch through three
// sentinels with 4,000 generic timers (half over HTTP, half over the NATS
// stream) and a live fleet, and freezes the replica (SIGSTOP) while
// timers fire, are reset with new payloads (later, and earlier into the
// coming outage; over HTTP, the stream and NATS requests) and cancelled,
// and devices go silent; then it kills (-9) the master and lets the replica go
// on, so that the sentinels promote a replica that never received those
// writes. Every timer fires exactly once, at its last acknowledged
// deadline with its last payload, none early, no cancelled one; those due
// during the failover fire right after the restore; the loss is told on
// sigwatch.system; no live device is reported lost and every silenced one
// is, once.
func TestTimersSentinelFailoverToLaggedReplica(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	rs, err := servers.StartRedisSentinel(t.TempDir(), servers.SentinelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	const threshold = 3 * time.Second
	r := startTimerRun(t, env, "SIGWATCH_REDIS_ADDRS="+strings.Join(rs.SentinelAddrs(), ","),
		"SIGWATCH_REDIS_SENTINEL_MASTER_SET="+rs.MasterSet(), "SIGWATCH_THRESHOLDS_DEFAULT="+threshold.String())
	lost := watchLost(t, env)
	system := testenv.RecordStream[dispatch.System](t, env.Conn(t), "SIGWATCH", "sigwatch.system")
	d := startDevices(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
	waitHTTP(t, r.addr, "/readyz", 30*time.Second)

	const n = 4000
	queues := []string{"lag-a", "lag-b"}
	start := time.Now().Add(5 * time.Second)
	spread := 8 * time.Second
	bodies := make([][2][]timerBody, len(queues)) // per queue: over HTTP, over NATS
	for j := range n {
		tb := timerBody{ID: fmt.Sprintf("s-%04d", j), At: start.Add(time.Duration(j) * spread / n).UnixMilli()}
		if j%4 == 0 {
			tb.Payload = json.RawMessage(fmt.Sprintf(`{"j":%d}`, j))
		}
		bodies[j%2][j/2%2] = append(bodies[j%2][j/2%2], tb)
	}
	for q, name := range queues {
		r.set(name, bodies[q][0], false)
		r.set(name, bodies[q][1], true)
	}
	r.waitStored(10 * time.Second)
	if time.Until(start) < 2*time.Second {
		t.Fatal("loading took too long: the first timers are due before the lag")
	}
	// Devices silenced now are lost before the lag: every device is
	// watched first (one that never got a signal through is never lost).
	waitEveryWatched(t, r.addr, d.ids, 10*time.Second)
	for i := range 10 {
		d.silence(d.ids[i*30])
	}

	master, err := rs.Master()
	if err != nil {
		t.Fatal(err)
	}
	var primary, replica *servers.Redis
	for _, n := range rs.Nodes {
		if n.Addr == master {
			primary = n
		} else {
			replica = n
		}
	}
	time.Sleep(time.Until(start.Add(time.Second)))
	atPause, err := replica.ReplOffset()
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := true
	t.Cleanup(func() {
		if paused {
			_ = replica.Resume()
		}
	})
	// The kernel's socket buffers between the two would carry the master's
	// last writes to the replica after its death: 16 MB of filler, expiring
	// soon, fills them first, so that everything after it is lost.
	filler := strings.Repeat("x", 8<<20)
	for i := range 2 {
		if _, err := primary.Do("SET", fmt.Sprint("lagfill:", i), filler, "PX", "20000"); err != nil {
			t.Fatal(err)
		}
	}
	filled, err := primary.ReplOffset()
	if err != nil {
		t.Fatal(err)
	}
	// Devices silenced in the lag have deadlines the replica never got.
	for i := range 10 {
		d.silence(d.ids[i*30+1])
	}
	// In the lag: a tenth of the timers due after it are pushed back 2 s
	// with a new payload, a twentieth pulled into the failover, a
	// twentieth cancelled; those due in it fire.
	kill := start.Add(2500 * time.Millisecond)
	var cancels []func() bool
	for q, name := range queues {
		var moved [3][]timerBody // over HTTP, the stream, requests
		for k, tb := range append(bodies[q][0], bodies[q][1]...) {
			j := 0
			_, _ = fmt.Sscanf(tb.ID, "s-%d", &j)
			due := time.UnixMilli(tb.At).Sub(start)
			switch {
			case j%10 == 1 && due >= 3*time.Second:
				moved[k%3] = append(moved[k%3], timerBody{ID: tb.ID, At: tb.At + 2000, Payload: json.RawMessage(fmt.Sprintf(`"later-%d"`, j))})
			case j%20 == 3 && due >= 5*time.Second:
				moved[k%3] = append(moved[k%3], timerBody{ID: tb.ID, At: start.Add(3500 * time.Millisecond).UnixMilli(), Mode: "set", Payload: json.RawMessage(fmt.Sprintf(`"sooner-%d"`, j))})
			case j%20 == 7 && due >= 3*time.Second:
				cancels = append(cancels, func() bool { return r.cancel(name, tb.ID) })
			}
		}
		r.set(name, moved[0], false)
		r.set(name, moved[1], true)
		r.request(name, moved[2])
	}
	pace := time.Until(kill.Add(-500*time.Millisecond)) / time.Duration(len(cancels))
	for _, c := range cancels {
		if !c() {
			t.Fatal("a cancel in the lag was refused")
		}
		time.Sleep(pace)
	}
	r.waitStored(5 * time.Second)
	time.Sleep(time.Until(kill))
	fired := timerEventCount(r.nc)
	atKill, err := primary.ReplOffset()
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	paused = false
	lagged := time.Since(start.Add(time.Second))
	// The replica reads what its socket still holds before the sentinels
	// (1 s of silence) promote it.
	time.Sleep(300 * time.Millisecond)
	got, err := replica.ReplOffset()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replica frozen %v: its offset %d at the pause, %d after (master: %d after the filler, %d at the kill); %d timers had fired",
		lagged.Round(time.Millisecond), atPause, got, filled, atKill, fired)
	if got >= filled {
		t.Fatalf("the replica reached offset %d, past the filler's %d: it did not miss the last writes", got, filled)
	}
	if _, err := rs.WaitFailover(t.Context()); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(kill)
	back := r.waitRestored(0)
	t.Logf("%d timers, %d cancelled in the lag; the replica promoted %v after the kill, sigwatch ready again %v after it",
		len(r.last), len(r.cancelled), promoted.Round(time.Millisecond), back.Sub(kill).Round(time.Millisecond))
	maxLate := r.check(back, 3*time.Second+time.Duration(n/5000)*time.Second)

	waitAllLost(t, lost, d, threshold+10*time.Second)
	neverLiveLost(t, lost, d, time.Second)
	checkExactlySilenced(t, lost, d, threshold)
	kinds := map[string]int{}
	for _, ev := range system.Bodies(nil) {
		kinds[ev.Kind]++
	}
	if kinds["redis_data_loss"] == 0 || kinds["redis_restored"] == 0 {
		t.Errorf("system events %v, want redis_data_loss and redis_restored", kinds)
	}
	t.Logf("%s", journalRestored.FindString(r.proc.logText()))
	t.Logf("restores: %q; timers due during the failover fired at most %v late; %d devices lost; system events %v",
		r.restores(), maxLate.Round(time.Millisecond), lost.Len(), kinds)
}

// journalRestored matches the log line of the timers a restore put back.
var journalRestored = regexp.MustCompile(`msg="timers restored from their journal".*`)

// request resets timers of queue to bodies over NATS requests, one reset
// a request, and records each that is answered stored.
func (r *timerRun) request(queue string, bodies []timerBody) {
	t := r.t
	for _, b := range bodies {
		data, _ := json.Marshal(b)
		msg, err := r.nc.Request("sigwatch.timers.reset."+queue, data, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(msg.Data), `"stored":1`) {
			t.Fatalf("a reset request answered %s", msg.Data)
		}
		m := shard.TimerMember(queue, b.ID)
		r.mu.Lock()
		r.last[m], r.payload[m] = b.At, string(b.Payload)
		r.mu.Unlock()
	}
}
