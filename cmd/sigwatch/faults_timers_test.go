package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// timerRun is one sigwatch process serving generic timers, with the last
// acknowledged state of every timer the test set.
type timerRun struct {
	t    *testing.T
	addr string
	proc *proc
	nc   *nats.Conn
	js   jetstream.JetStream

	mu        sync.Mutex
	last      map[string]int64  // member -> last acknowledged deadline
	payload   map[string]string // member -> its last payload ("" none)
	cancelled map[string]bool   // acknowledged cancels
}

// startTimerRun starts sigwatch with a short de-duplication window, so
// that a timer fired twice shows as two events, and waits for its API and
// reset stream; extra settings are added last.
func startTimerRun(t *testing.T, env *testenv.Env, extra ...string) *timerRun {
	r := &timerRun{t: t, addr: freeAddr(t), last: map[string]int64{}, payload: map[string]string{}, cancelled: map[string]bool{}}
	r.proc = startProc(t, env, "sigwatch", append([]string{"SIGWATCH_SHARDS_INITIAL=4", "SIGWATCH_SCANNER_LEASE_TTL=1500ms",
		"SIGWATCH_ROLES=ingest,scanner,api", "SIGWATCH_NATS_DUPLICATES=1s", "SIGWATCH_HTTP_ADDR=" + r.addr}, extra...)...)
	r.nc = env.Conn(t, nats.ReconnectWait(50*time.Millisecond), nats.MaxReconnects(-1))
	var err error
	if r.js, err = jetstream.New(r.nc); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the API and the reset stream", func() bool {
		c, _ := apiCall(t, "GET", r.addr, "/v1/timers/q/none", "", nil)
		_, err := r.js.Stream(t.Context(), "SIGWATCH_TIMERS")
		return c == 404 && err == nil
	})
	return r
}

// set resets timers of queue to bodies (their At and Payload), over HTTP
// or the NATS stream, in batches, and records them as acknowledged.
func (r *timerRun) set(queue string, bodies []timerBody, overNATS bool) {
	t := r.t
	for lo := 0; lo < len(bodies); lo += 500 {
		batch := bodies[lo:min(lo+500, len(bodies))]
		if overNATS {
			data, _ := json.Marshal(batch)
			if _, err := r.js.Publish(t.Context(), "sigwatch.timers.set."+queue, data); err != nil {
				t.Fatal(err)
			}
		} else if code, body := apiCall(t, "POST", r.addr, "/v1/timers/"+queue, "", batch); code != 200 {
			t.Fatalf("POST: %d %s", code, body)
		}
		r.mu.Lock()
		for _, b := range batch {
			m := shard.TimerMember(queue, b.ID)
			r.last[m], r.payload[m] = b.At, string(b.Payload)
		}
		r.mu.Unlock()
	}
}

// cancel cancels a timer over HTTP and reports whether it was
// acknowledged (recorded then).
func (r *timerRun) cancel(queue, id string) bool {
	code, _ := apiCall(r.t, "DELETE", r.addr, "/v1/timers/"+queue+"/"+id, "", nil)
	if code != http.StatusNoContent {
		return false
	}
	r.mu.Lock()
	r.cancelled[shard.TimerMember(queue, id)] = true
	r.mu.Unlock()
	return true
}

// waitStored waits until the reset stream holds nothing: every reset
// published over NATS is stored and journalled.
func (r *timerRun) waitStored(timeout time.Duration) {
	testenv.WaitFor(r.t, timeout, "the resets published over NATS stored", func() bool {
		s, err := r.js.Stream(r.t.Context(), "SIGWATCH_TIMERS")
		return err == nil && s.CachedInfo().State.Msgs == 0
	})
}

// check waits until every timer not cancelled fired, then checks each
// fired exactly once, at its last acknowledged deadline, with its last
// payload, none early, no cancelled one at all, and none later than late
// after its deadline or after back, whichever is later. It returns the
// largest lateness seen among the timers due before back.
func (r *timerRun) check(back time.Time, late time.Duration) time.Duration {
	t := r.t
	want := len(r.last) - len(r.cancelled)
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("%d timers fired", want), func() bool { return timerEventCount(r.nc) >= want })
	time.Sleep(2 * time.Second) // a second fire would land by now
	fires := readTimerEvents(t, r.nc, len(r.last)+1)
	byMember := map[string]int{}
	var early, wrong, tooLate, cancelledFired int
	var maxLate time.Duration
	for _, f := range fires {
		m := shard.TimerMember(f.ev.Queue, f.ev.Timer)
		byMember[m]++
		p := string(f.ev.Payload)
		if r.cancelled[m] {
			if cancelledFired++; cancelledFired <= 5 {
				t.Errorf("%s fired at %d, but its cancel was acknowledged", m, f.ev.Deadline)
			}
			continue
		}
		if f.ev.Deadline != r.last[m] || p != r.payload[m] {
			if wrong++; wrong <= 5 {
				t.Errorf("%s fired at %d with %q, want its last deadline %d with %q", m, f.ev.Deadline, p, r.last[m], r.payload[m])
			}
		}
		if f.ev.FiredAt < f.ev.Deadline || f.stored.UnixMilli() < f.ev.Deadline-50 {
			if early++; early <= 5 {
				t.Errorf("%s fired early: deadline %d, fired_at %d", m, f.ev.Deadline, f.ev.FiredAt)
			}
		}
		due := time.UnixMilli(f.ev.Deadline)
		l := f.stored.Sub(due)
		if due.Before(back) {
			maxLate = max(maxLate, l)
		}
		from := due
		if back.After(due) {
			from = back
		}
		if f.stored.Sub(from) > late {
			if tooLate++; tooLate <= 5 {
				t.Errorf("%s fired %v after its deadline %d", m, l, f.ev.Deadline)
			}
		}
	}
	missing, twice := 0, 0
	for m := range r.last {
		switch n := byMember[m]; {
		case r.cancelled[m]:
		case n == 0:
			if missing++; missing <= 5 {
				t.Errorf("%s never fired (deadline %d)", m, r.last[m])
			}
		case n > 1:
			if twice++; twice <= 5 {
				t.Errorf("%s fired %d times", m, n)
			}
		}
	}
	if missing+twice+early+wrong+tooLate+cancelledFired > 0 {
		t.Fatalf("%d timers, %d cancelled, %d events: %d missing, %d fired twice, %d early, %d not as last set, %d too late, %d cancelled fired",
			len(r.last), len(r.cancelled), len(fires), missing, twice, early, wrong, tooLate, cancelledFired)
	}
	return maxLate
}

// restoreDone matches the log line of a finished restore.
var restoreDone = regexp.MustCompile(`msg="(Redis restored from the registry|Redis restarted; checked against the registry: nothing missing)".*took=\S+`)

// restores returns the finished restores the process logged.
func (r *timerRun) restores() []string { return restoreDone.FindAllString(r.proc.logText(), -1) }

// waitRestored waits until more than done restores finished and the
// process is ready, and returns when.
func (r *timerRun) waitRestored(done int) time.Time {
	testenv.WaitFor(r.t, 30*time.Second, "the restore", func() bool { return len(r.restores()) > done })
	waitHTTP(r.t, r.addr, "/readyz", 30*time.Second)
	return time.Now()
}

// TestTimersSurviveRedisEmpty loads 20,000 generic timers (half over HTTP,
// half over the NATS stream, some with payloads; TEST_TIMERS sets
// another count, e.g. 100000), resets a tenth of them to later deadlines
// with new payloads and cancels a hundredth of those due later, then kills Redis
// (-9) mid-window and starts it empty, and kills it again while the
// restore runs. Every timer fires exactly once, at its last acknowledged
// deadline with its last payload, none early, none cancelled; those due
// while Redis was down fire right after the restore.
func TestTimersSurviveRedisEmpty(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	r := startTimerRun(t, env)
	n, queues := 20_000, 4
	if v, err := strconv.Atoi(os.Getenv("TEST_TIMERS")); err == nil && v >= 1000 {
		n = v // the 100,000 in a run of its own
	}
	// Loading takes about a second per 5,000 timers here.
	start := time.Now().Add(8*time.Second + time.Duration(max(0, n-20_000)/5000)*time.Second)
	spread := 12 * time.Second
	bodies := make([][2][]timerBody, queues) // per queue: over HTTP, over NATS
	for j := range n {
		tb := timerBody{ID: fmt.Sprintf("t-%05d", j), At: start.Add(time.Duration(j) * spread / time.Duration(n)).UnixMilli()}
		if j%5 == 0 {
			tb.Payload = json.RawMessage(fmt.Sprintf(`{"j":%d}`, j))
		}
		bodies[j%queues][j/queues%2] = append(bodies[j%queues][j/queues%2], tb)
	}
	loaded := time.Now()
	for q := range queues {
		r.set(fmt.Sprint("q", q), bodies[q][0], false)
		r.set(fmt.Sprint("q", q), bodies[q][1], true)
	}
	r.waitStored(20 * time.Second)
	t.Logf("loaded %d timers in %v", n, time.Since(loaded).Round(time.Millisecond))
	if time.Until(start) < time.Second {
		t.Fatal("loading took too long: the first timers are due before the resets")
	}
	// A tenth are pushed back 3 s with a new payload, half over NATS; a
	// hundredth of those due after the loss are cancelled.
	for q := range queues {
		var later [2][]timerBody
		for k, tb := range append(bodies[q][0], bodies[q][1]...) {
			j := 0
			_, _ = fmt.Sscanf(tb.ID, "t-%d", &j)
			due := time.UnixMilli(tb.At).Sub(start)
			switch {
			case j%10 == 1:
				later[k%2] = append(later[k%2], timerBody{ID: tb.ID, At: tb.At + 3000, Payload: json.RawMessage(fmt.Sprintf(`"reset-%d"`, j))})
			case j%100 == 2 && due >= 6*time.Second:
				if !r.cancel(fmt.Sprint("q", q), tb.ID) {
					t.Fatalf("cancel of %s refused", tb.ID)
				}
			}
		}
		r.set(fmt.Sprint("q", q), later[0], false)
		r.set(fmt.Sprint("q", q), later[1], true)
	}
	r.waitStored(10 * time.Second)
	t.Logf("%d timers, %d reset again, %d cancelled; stored %v before the first deadline", len(r.last), n/10, len(r.cancelled), time.Until(start).Round(time.Millisecond))

	time.Sleep(time.Until(start.Add(4 * time.Second)))
	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	// The loss is seen within a generation beat (200 ms), and the restore
	// waits 500 ms for claims in flight before it reads anything.
	time.Sleep(400 * time.Millisecond)
	done := len(r.restores())
	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	back := r.waitRestored(done)
	t.Logf("Redis emptied twice; ready again %v after the first deadline", back.Sub(start).Round(time.Millisecond))
	// Past the restore, the timers due in the outage fire as one backlog,
	// here (two cores, the race detector) at no less than 5,000 a second.
	maxLate := r.check(back, 3*time.Second+time.Duration(n/5000)*time.Second)
	log := r.proc.logText()
	t.Logf("restores: %q; a restore found before the second kill: %d; restore failures logged: %d; timers due during the outage fired at most %v late",
		r.restores(), done, strings.Count(log, "restore failed"), maxLate.Round(time.Millisecond))
}

// TestTimersRedisRollback rolls Redis back about a second (its
// append-only file as it was a second before a SIGKILL, what appendfsync
// everysec may keep) while timers fire and are cancelled: a timer fired or
// cancelled inside the lost second comes back in Redis, and must not fire
// (again).
func TestTimersRedisRollback(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true, RedisPersist: true})
	r := startTimerRun(t, env)
	const n = 4000
	start := time.Now().Add(5 * time.Second)
	spread := 4 * time.Second
	var bodies []timerBody
	for j := range n {
		bodies = append(bodies, timerBody{ID: fmt.Sprintf("r-%04d", j), At: start.Add(time.Duration(j) * spread / n).UnixMilli(),
			Payload: json.RawMessage(fmt.Sprintf(`%d`, j))})
	}
	r.set("roll", bodies[:n/2], false)
	r.set("roll", bodies[n/2:], true)
	r.waitStored(10 * time.Second)

	kill := start.Add(2 * time.Second)
	// Timers due after the kill are cancelled one by one up to it.
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		const every = 7
		pace := time.Until(kill) / (n / 2 / every)
		for j := n / 2; j < n && ctx.Err() == nil; j += every {
			r.cancel("roll", bodies[j].ID)
			time.Sleep(pace)
		}
	})
	time.Sleep(time.Until(kill.Add(-time.Second)))
	aof := filepath.Join(env.Redis.Dir, "appendonlydir")
	snap := filepath.Join(t.TempDir(), "aof")
	if err := os.CopyFS(snap, os.DirFS(aof)); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	before := len(r.cancelled)
	r.mu.Unlock()
	time.Sleep(time.Until(kill))
	if err := env.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	stop()
	wg.Wait()
	fired := timerEventCount(r.nc)
	if err := os.RemoveAll(aof); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(aof, os.DirFS(snap)); err != nil {
		t.Fatal(err)
	}
	if err := env.Redis.Restart(); err != nil {
		t.Fatal(err)
	}
	back := r.waitRestored(0)
	t.Logf("Redis rolled back 1 s at the kill: %d timers had fired, %d cancels acknowledged, %d of them in the lost second",
		fired, len(r.cancelled), len(r.cancelled)-before)
	maxLate := r.check(back, 3*time.Second)
	t.Logf("restores: %q; timers due during the outage fired at most %v late", r.restores(), maxLate.Round(time.Millisecond))
}
