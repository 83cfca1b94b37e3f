package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// binary is the sigwatch binary built once for the process-level tests,
// with the demo tag so that TestDemoShowsLostDevices can run `sigwatch demo`.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sigwatch-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "sigwatch")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	args := []string{"build", "-tags", "demo", "-o", binary}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(gobin, append(args, ".")...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build sigwatch: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one sigwatch process under test.
type proc struct {
	t   *testing.T
	cmd *exec.Cmd
	log string
}

// startProc runs `sigwatch run` against env with the given extra settings.
func startProc(t *testing.T, env *testenv.Env, name string, extra ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "run")
	cmd.Env = append(os.Environ(),
		"SIGWATCH_REDIS_ADDRS="+env.Redis.Addr,
		"SIGWATCH_NATS_URL="+env.NATS.URL,
		"SIGWATCH_MQTT_CLIENT_ID=sigwatch-e2e",
		"SIGWATCH_MQTT_SHARED_GROUP=sigwatch",
		"SIGWATCH_HTTP_ADDR=127.0.0.1:0",
		"SIGWATCH_SCANNER_LEASE_TTL=2s",
		"SIGWATCH_LOG_LEVEL=debug",
	)
	if env.Mosquitto != nil {
		cmd.Env = append(cmd.Env, "SIGWATCH_MQTT_BROKERS="+env.Mosquitto.URL)
	}
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, log: logPath}
	t.Cleanup(func() {
		p.kill()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s log (tail) ---\n%s", name, tail(string(b), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
	}
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
}

// devices publishes a signal for every live device every period, like a
// fleet behind an MQTT bridge. Devices can be silenced at any moment.
type devices struct {
	t      *testing.T
	c      mqtt.Client
	ids    []string
	period time.Duration
	// stamped devices carry their send time in the payload ("ts", unix
	// ms), for timestamp.mode payload.
	stamped bool

	mu       sync.Mutex
	silentAt map[string]time.Time // device -> last signal it will ever send (acked)
	last     map[string]time.Time // device -> send time of its last acknowledged signal
}

func startDevices(t *testing.T, broker string, n int, period time.Duration) *devices {
	t.Helper()
	return startFleet(t, broker, n, period, false)
}

// startFleet is startDevices whose devices, with stamped set, carry their
// send time in the payload.
func startFleet(t *testing.T, broker string, n int, period time.Duration, stamped bool) *devices {
	t.Helper()
	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(broker).SetClientID(fmt.Sprintf("e2e-devices-%d", time.Now().UnixNano())).
		SetAutoReconnect(true).SetOrderMatters(false))
	d := &devices{t: t, c: c, period: period, stamped: stamped, silentAt: map[string]time.Time{}, last: map[string]time.Time{}}
	for i := 0; i < n; i++ {
		d.ids = append(d.ids, fmt.Sprintf("e2e-%04d", i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go d.run(ctx, done)
	t.Cleanup(func() { cancel(); <-done })
	return d
}

func (d *devices) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(d.period)
	defer tick.Stop()
	for {
		d.mu.Lock()
		live := make([]string, 0, len(d.ids))
		for _, id := range d.ids {
			if _, silent := d.silentAt[id]; !silent {
				live = append(live, id)
			}
		}
		d.mu.Unlock()
		// A signal's send time is a lower bound of when sigwatch received
		// it, so last+threshold is the earliest a lost event may carry.
		toks := make([]mqtt.Token, len(live))
		sent := make([]time.Time, len(live))
		for j, id := range live {
			sent[j] = time.Now()
			payload := []byte{}
			if d.stamped {
				payload = fmt.Appendf(nil, `{"ts":%d}`, sent[j].UnixMilli())
			}
			toks[j] = d.c.Publish("devices/"+id+"/signal", 1, false, payload)
		}
		for j, tok := range toks {
			if tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
				d.mu.Lock()
				d.last[live[j]] = sent[j]
				d.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// silence stops id's signals and returns when it was last acknowledged.
func (d *devices) silence(id string) {
	d.mu.Lock()
	d.silentAt[id] = time.Now()
	d.mu.Unlock()
}

func (d *devices) silenced() map[string]time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]time.Time, len(d.silentAt))
	for k, v := range d.silentAt {
		out[k] = v
	}
	return out
}

// lostLog is every lost event stored in the SIGWATCH stream.
type lostLog = testenv.Recorder[dispatch.Lost]

func watchLost(t *testing.T, env *testenv.Env) *lostLog {
	t.Helper()
	return testenv.RecordStream[dispatch.Lost](t, env.Conn(t), "SIGWATCH", "sigwatch.lost.>")
}

func byDevice(l *lostLog) map[string][]dispatch.Lost {
	out := map[string][]dispatch.Lost{}
	for _, ev := range l.Bodies(nil) {
		out[ev.Device] = append(out[ev.Device], ev)
	}
	return out
}

func lags(l *lostLog) (p50, p99, worst time.Duration) {
	var ls []time.Duration
	for _, e := range l.Events() {
		ls = append(ls, e.At.Sub(time.UnixMilli(e.Body.Deadline)))
	}
	if len(ls) == 0 {
		return 0, 0, 0
	}
	sort.Slice(ls, func(a, b int) bool { return ls[a] < ls[b] })
	return ls[len(ls)/2], ls[len(ls)*99/100], ls[len(ls)-1]
}

// neverLiveLost keeps watching for span while live devices go on signalling: a live device
// reported lost fails the test at once.
func neverLiveLost(t *testing.T, l *lostLog, d *devices, span time.Duration) {
	t.Helper()
	testenv.Never(t, span, "a live device reported lost", func() bool {
		silenced := d.silenced()
		for _, ev := range l.Bodies(nil) {
			if _, ok := silenced[ev.Device]; !ok {
				t.Logf("live device %s reported lost: %+v", ev.Device, ev)
				return true
			}
		}
		return false
	})
}

// checkExactlySilenced asserts the three invariants at the JetStream level:
// exactly the silenced devices are reported lost, each once, none before its
// deadline, and no deadline earlier than last signal + threshold.
func checkExactlySilenced(t *testing.T, l *lostLog, d *devices, threshold time.Duration) {
	t.Helper()
	silenced := d.silenced()
	got := byDevice(l)
	for id, evs := range got {
		if _, ok := silenced[id]; !ok {
			t.Errorf("live device %s reported lost: %+v", id, evs)
			continue
		}
		if len(evs) != 1 {
			t.Errorf("device %s reported lost %d times, want once: %+v", id, len(evs), evs)
		}
		for _, ev := range evs {
			if ev.FiredAt < ev.Deadline {
				t.Errorf("device %s fired at %d before its deadline %d (invariant 1)", id, ev.FiredAt, ev.Deadline)
			}
			d.mu.Lock()
			last := d.last[id]
			d.mu.Unlock()
			if early := last.Add(threshold).Truncate(time.Millisecond); time.UnixMilli(ev.FiredAt).Before(early) {
				t.Errorf("device %s fired at %d, earlier than last signal %v + threshold", id, ev.FiredAt, last)
			}
		}
	}
	for id := range silenced {
		if len(got[id]) == 0 {
			t.Errorf("silenced device %s never reported lost (invariant 2)", id)
		}
	}
	for id, n := range l.MsgIDs() {
		if n != 1 {
			t.Errorf("message id %s stored %d times in the stream, want 1 (invariant 3)", id, n)
		}
	}
}

// waitEveryWatched waits until the sigwatch at addr (no token) watches
// every device of ids.
func waitEveryWatched(t *testing.T, addr string, ids []string, timeout time.Duration) {
	t.Helper()
	left := slices.Clone(ids)
	testenv.WaitFor(t, timeout, "every device watched", func() bool {
		left = slices.DeleteFunc(left, func(id string) bool {
			resp, err := http.Get("http://" + addr + "/v1/devices/" + url.PathEscape(id))
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var dev struct{ Watched bool }
			return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&dev) == nil && dev.Watched
		})
		return len(left) == 0
	})
}

func waitAllLost(t *testing.T, l *lostLog, d *devices, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, "every silenced device reported lost", func() bool {
		got := byDevice(l)
		for id := range d.silenced() {
			if len(got[id]) == 0 {
				return false
			}
		}
		return true
	})
}

// TestPipelineLiveAndSilent runs one sigwatch process: devices that keep
// signalling are never reported; devices that go silent are reported once,
// never early. It prints the fire lag.
func TestPipelineLiveAndSilent(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold = 2 * time.Second
	startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT="+threshold.String())
	l := watchLost(t, env)
	d := startDevices(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
	time.Sleep(3 * time.Second)
	for i := 0; i < 30; i++ {
		d.silence(d.ids[i*7])
		time.Sleep(50 * time.Millisecond)
	}
	waitAllLost(t, l, d, 20*time.Second)
	neverLiveLost(t, l, d, threshold) // live devices keep going; any false report would show up now
	checkExactlySilenced(t, l, d, threshold)
	p50, p99, worst := lags(l)
	t.Logf("fire lag (event received - deadline): p50 %v p99 %v max %v over %d events", p50, p99, worst, l.Len())
}

// TestTwoProcessesKillOne runs two sigwatch processes that share Redis, NATS
// and the broker; one is killed with -9 while devices go silent. No expiry is
// lost and none is duplicated in the stream. Ingest runs both ways: each
// process consuming the whole stream, and the two splitting it in a shared
// subscription group.
func TestTwoProcessesKillOne(t *testing.T) {
	for _, group := range []string{"", "sigwatch"} {
		name := "redundant"
		if group != "" {
			name = "shared"
		}
		t.Run(name, func(t *testing.T) {
			env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
			const threshold = 2 * time.Second
			thr := "SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String()
			g := "SIGWATCH_MQTT_SHARED_GROUP=" + group
			a := startProc(t, env, "a", thr, g, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-a")
			startProc(t, env, "b", thr, g, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-b")
			l := watchLost(t, env)
			d := startDevices(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
			time.Sleep(3 * time.Second)
			for i := 0; i < 40; i++ {
				d.silence(d.ids[i*7])
				if i == 20 {
					a.kill()
				}
				time.Sleep(75 * time.Millisecond)
			}
			waitAllLost(t, l, d, 30*time.Second)
			neverLiveLost(t, l, d, threshold)
			checkExactlySilenced(t, l, d, threshold)
		})
	}
}

// TestRestartWholeService kills the only sigwatch process with -9 while
// devices keep signalling, then starts it again: no live device is reported
// lost, and devices silenced before the kill are reported exactly once.
func TestRestartWholeService(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold = 2 * time.Second
	thr := "SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String()
	p := startProc(t, env, "first", thr)
	l := watchLost(t, env)
	d := startDevices(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
	time.Sleep(3 * time.Second)
	for i := 0; i < 20; i++ {
		d.silence(d.ids[i*11])
	}
	time.Sleep(500 * time.Millisecond)
	p.kill()
	time.Sleep(4 * time.Second) // longer than the threshold: every deadline passes while nobody watches
	startProc(t, env, "second", thr)
	waitAllLost(t, l, d, 30*time.Second)
	neverLiveLost(t, l, d, 2*threshold)
	checkExactlySilenced(t, l, d, threshold)
}

// TestBadInputDoesNotHurtGoodDevices sends malformed topics and huge ids
// between good signals over real MQTT: the process survives, every bad
// message is dead-lettered, good devices stay watched.
func TestBadInputDoesNotHurtGoodDevices(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT=3s", "SIGWATCH_MQTT_TOPICS=devices/#")
	invalid := testenv.Record[dispatch.Invalid](t, env.Conn(t), "sigwatch.invalid")
	d := startDevices(t, env.Mosquitto.URL, 50, 200*time.Millisecond)
	time.Sleep(2 * time.Second)
	// Topics the broker passes on but sigwatch must refuse. (Control
	// characters are refused by Mosquitto itself; ingest's own tests feed
	// them to the handler directly.) Each bad device is a client of its own.
	bad := []string{
		"devices//signal", // empty id
		"devices/" + strings.Repeat("x", 5000) + "/signal", // huge id
		"devices", // no id level
	}
	for j, topic := range bad {
		bc := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID(fmt.Sprintf("e2e-bad-%d", j)))
		if tok := bc.Publish(topic, 1, false, []byte("junk")); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Errorf("broker refused %q: %v", topic, tok.Error())
		}
		bc.Disconnect(100)
	}
	// Ids with NATS wildcard characters are valid device ids.
	for _, id := range []string{"a.b", "star*", "gt>", "sp ace"} {
		d.c.Publish("devices/"+id+"/signal", 1, false, []byte{}).Wait()
	}
	invalid.WaitN(t, 10*time.Second, 3, "invalid events", nil)
	l := watchLost(t, env)
	testenv.Never(t, 4*time.Second, "a good device reported lost after bad input", func() bool {
		for id := range byDevice(l) {
			if strings.HasPrefix(id, "e2e-") {
				t.Logf("good device %s reported lost after bad input", id)
				return true
			}
		}
		return false
	})
	for _, ev := range invalid.Bodies(nil) {
		if ev.Reason == "" || ev.ID == "" {
			t.Errorf("invalid event without reason or id: %+v", ev)
		}
	}
}

// cli runs a sigwatch shards subcommand on env's Redis directly (--config)
// and returns its output.
func cli(t *testing.T, env *testenv.Env, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary, append(args, "--config", redisConfig(t, env))...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sigwatch %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestDoublingAcrossProcesses doubles the shards of a running deployment
// with `sigwatch shards double` while devices signal and go silent, kills one
// of three processes with -9 and starts a fourth during the drain: exactly the
// silenced devices are reported, once, never early, and every shard, old and
// new, has one live owner within the lease time.
func TestDoublingAcrossProcesses(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold = 2 * time.Second
	thr := "SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String()
	a := startProc(t, env, "a", thr, "SIGWATCH_MQTT_SHARED_GROUP=", "SIGWATCH_MQTT_CLIENT_ID=sigwatch-a")
	startProc(t, env, "b", thr, "SIGWATCH_MQTT_SHARED_GROUP=", "SIGWATCH_MQTT_CLIENT_ID=sigwatch-b")
	startProc(t, env, "c", thr, "SIGWATCH_MQTT_SHARED_GROUP=", "SIGWATCH_MQTT_CLIENT_ID=sigwatch-c")
	l := watchLost(t, env)
	d := startDevices(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
	time.Sleep(3 * time.Second)
	for i := 0; i < 45; i++ {
		d.silence(d.ids[i*6])
		switch i {
		case 5:
			out := cli(t, env, "shards", "double")
			if !strings.Contains(out, "16 -> 32") {
				t.Fatalf("shards double said %q, want 16 -> 32", out)
			}
		case 20:
			a.kill()
		case 25:
			startProc(t, env, "d", thr, "SIGWATCH_MQTT_SHARED_GROUP=", "SIGWATCH_MQTT_CLIENT_ID=sigwatch-d")
		}
		time.Sleep(75 * time.Millisecond)
	}
	deadPID := fmt.Sprintf("-%d-", a.cmd.Process.Pid)
	testenv.WaitFor(t, 10*time.Second, "every shard owned by a live process", func() bool {
		var v api.Shards
		if err := json.Unmarshal([]byte(cli(t, env, "shards", "status", "--json")), &v); err != nil {
			t.Fatal(err)
		}
		if v.Shards != 32 || len(v.List) != 32 {
			return false
		}
		for _, s := range v.List {
			if s.Owner == "" || strings.Contains(s.Owner, deadPID) {
				return false
			}
		}
		return true
	})
	waitAllLost(t, l, d, 30*time.Second)
	neverLiveLost(t, l, d, threshold)
	checkExactlySilenced(t, l, d, threshold)
}

// TestPayloadTimestampsOutOfOrder runs devices that stamp their signals
// themselves, out of order and up to a second old, for many seconds: no live
// device is reported, silenced ones are reported once, never before their
// latest signal's time plus the threshold.
func TestPayloadTimestampsOutOfOrder(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const threshold = 2500 * time.Millisecond
	startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT="+threshold.String(), "SIGWATCH_TIMESTAMP_MODE=payload")
	l := watchLost(t, env)
	c := testenv.MQTT(t, mqtt.NewClientOptions().AddBroker(env.Mosquitto.URL).SetClientID("e2e-payload"))
	const n = 200
	silentFrom := map[int]time.Time{}
	newest := map[int]int64{} // newest ts each device sent
	start := time.Now()
	for round := 0; time.Since(start) < 8*time.Second; round++ {
		now := time.Now()
		for i := 0; i < n; i++ {
			if _, silent := silentFrom[i]; silent {
				continue
			}
			// Every third round a device re-sends an older reading after a
			// newer one: it must not pull the deadline back.
			ts := now.Add(-time.Duration((i*37+round*11)%1000) * time.Millisecond).UnixMilli()
			if round%3 == 2 {
				ts = now.Add(-900 * time.Millisecond).UnixMilli()
			}
			if ts > newest[i] {
				newest[i] = ts
			}
			c.Publish(fmt.Sprintf("devices/p-%03d/signal", i), 1, false, []byte(fmt.Sprintf(`{"ts":%d,"v":1}`, ts)))
		}
		if round == 10 {
			for i := 0; i < n; i += 10 {
				silentFrom[i] = now
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	testenv.WaitFor(t, 15*time.Second, "silenced payload devices reported", func() bool {
		got := byDevice(l)
		for i := range silentFrom {
			if len(got[fmt.Sprintf("p-%03d", i)]) == 0 {
				return false
			}
		}
		return true
	})
	for id, evs := range byDevice(l) {
		var i int
		fmt.Sscanf(id, "p-%03d", &i)
		if _, ok := silentFrom[i]; !ok {
			t.Errorf("live device %s reported lost: %+v", id, evs)
			continue
		}
		if len(evs) != 1 {
			t.Errorf("device %s reported %d times, want once", id, len(evs))
		}
		if want := newest[i] + threshold.Milliseconds(); evs[0].Deadline < want || evs[0].FiredAt < evs[0].Deadline {
			t.Errorf("device %s: deadline %d fired %d, want deadline >= newest ts + threshold = %d and no early fire", id, evs[0].Deadline, evs[0].FiredAt, want)
		}
	}
}

// TestGracefulStopHandsOverAtOnce stops one of two processes with SIGTERM:
// it exits cleanly and releases its leases, so the other owns every shard
// long before the lease time would have run out.
func TestGracefulStopHandsOverAtOnce(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	ttl := "SIGWATCH_SCANNER_LEASE_TTL=20s"
	a := startProc(t, env, "a", ttl, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-a")
	b := startProc(t, env, "b", ttl, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-b")
	owners := func() map[string]int {
		cmd := exec.Command(binary, "shards", "status", "--json", "--config", redisConfig(t, env))
		out, err := cmd.Output()
		var v api.Shards
		if err != nil || json.Unmarshal(out, &v) != nil {
			return nil // not started yet
		}
		m := map[string]int{}
		for _, s := range v.List {
			if s.Owner != "" {
				owner, _, _ := strings.Cut(s.Owner, "|")
				m[owner]++
			}
		}
		return m
	}
	testenv.WaitFor(t, 10*time.Second, "both processes own shards", func() bool { return len(owners()) == 2 })
	stopped := time.Now()
	a.stop()
	if code := a.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("sigwatch exited %d after SIGTERM, want 0", code)
	}
	bPID := fmt.Sprintf("-%d-", b.cmd.Process.Pid)
	testenv.WaitFor(t, 5*time.Second, "the other process owns every shard", func() bool {
		m := owners()
		if len(m) != 1 {
			return false
		}
		for o, n := range m {
			return n == 16 && strings.Contains(o, bPID)
		}
		return false
	})
	t.Logf("handed over %v after SIGTERM (lease time 20s)", time.Since(stopped).Round(time.Millisecond))
}

// redisConfig is a config file that names env's Redis, for the commands
// that reach it directly.
func redisConfig(t *testing.T, env *testenv.Env) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "redis.yaml")
	if err := os.WriteFile(p, []byte("redis:\n  addrs: ["+env.Redis.Addr+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
