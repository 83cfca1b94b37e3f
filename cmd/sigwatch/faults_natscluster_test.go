package main

import (
	"context"
	"encoding/json"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestNATSClusterFailover runs sigwatch against a three-node NATS cluster with the SIGWATCH
// stream at three replicas, and kills with -9 first the node sigwatch is connected to, then the
// stream's leader, each while devices keep going silent so that lost events are being published
// as the node dies. Each killed node is restarted before the next kill, so the stream keeps a
// quorum. sigwatch moves to a live node and goes on publishing: every silenced device is
// reported lost exactly once, none before its deadline, and no live device is reported
// (invariants 1, 2 and 3 across a NATS failover). The only sigwatch process is never fenced
// out of its own shards.
func TestNATSClusterFailover(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	cluster := testenv.NATSCluster(t)
	// sigwatch and the test's own clients reach NATS through every node's URL.
	env.NATS = &servers.NATS{URL: cluster.URL()}
	const (
		threshold = 2 * time.Second
		stream    = "SIGWATCH"
	)
	sw := startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT="+threshold.String(),
		"SIGWATCH_NATS_REPLICAS=3", "SIGWATCH_LOG_LEVEL=info")
	l := watchLost(t, env)
	js, err := jetstream.New(env.Conn(t))
	if err != nil {
		t.Fatal(err)
	}
	checkReplicas(t, js, stream, 3)
	d := startDevices(t, env.Mosquitto.URL, 400, 300*time.Millisecond)
	time.Sleep(3 * time.Second)

	silence := steadily(d)
	// silenceWhile runs silence(span) beside wait, and returns once both are done.
	silenceWhile := func(span time.Duration, wait func()) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			silence(span)
		}()
		wait()
		<-done
	}
	node := func(what string, f func() (int, error), not int) int {
		t.Helper()
		var (
			i   int
			err error
		)
		testenv.WaitFor(t, 20*time.Second, what, func() bool {
			i, err = f()
			return err == nil && i >= 0 && i != not
		})
		return i
	}
	connected := func() (int, error) { return cluster.ConnectedNode("sigwatch") }
	leader := func() (int, error) { return cluster.StreamLeader(stream) }

	// The first silenced devices fall due just as sigwatch's node dies.
	silence(threshold + 500*time.Millisecond)
	first := node("sigwatch connected", connected, -1)
	lead := node("a stream leader", leader, -1)
	killed := time.Now()
	if err := cluster.Kill(first); err != nil {
		t.Fatal(err)
	}
	silenceWhile(1500*time.Millisecond, func() {
		moved := node("sigwatch connected to another node", connected, first)
		t.Logf("killed %s (sigwatch's node; stream leader %s): sigwatch on %s %v later",
			cluster.Name(first), cluster.Name(lead), cluster.Name(moved), time.Since(killed).Round(time.Millisecond))
	})
	// Before the node comes back, the stream holds the events of the devices silenced so far
	// (the test's own recorder may still be recovering from the kill).
	testenv.WaitFor(t, 20*time.Second, "lost events stored for the devices silenced so far", func() bool {
		return lostStored(js, stream) >= len(d.silenced())
	})
	t.Logf("%d lost events stored %v after the kill", len(d.silenced()), time.Since(killed).Round(time.Millisecond))
	restarted := time.Now()
	if err := cluster.Restart(first); err != nil {
		t.Fatal(err)
	}

	silence(threshold + 500*time.Millisecond)
	lead = node("a stream leader", leader, -1)
	conn, _ := connected()
	killed = time.Now()
	if err := cluster.Kill(lead); err != nil {
		t.Fatal(err)
	}
	silenceWhile(1500*time.Millisecond, func() {
		newLead := node("a new stream leader", leader, lead)
		t.Logf("killed %s (stream leader; sigwatch on %s): new leader %s %v later",
			cluster.Name(lead), cluster.Name(conn), cluster.Name(newLead), time.Since(killed).Round(time.Millisecond))
	})
	if err := cluster.Restart(lead); err != nil {
		t.Fatal(err)
	}

	waitAllLost(t, l, d, 30*time.Second)
	t.Logf("every silenced device seen lost %v after the second kill", time.Since(killed).Round(time.Millisecond))
	neverLiveLost(t, l, d, threshold)
	checkExactlySilenced(t, l, d, threshold)
	before, after := storedLags(t, js, stream, restarted)
	t.Logf("%d silenced devices; lost event stored after its deadline (median, max): around the first kill %v, %v; around the second %v, %v",
		len(d.silenced()), before[0], before[1], after[0], after[1])

	// A replicated stream refuses a fenced publish while another of the shard's is being
	// replicated; that is no fence, and the only sigwatch process must never take it for one.
	b, err := os.ReadFile(sw.log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "shard fenced out"); n != 0 {
		t.Errorf("the only sigwatch process logged %d shards fenced out, want 0", n)
	}
}

// TestNATSClusterFrozenNode freezes (SIGSTOP) the node sigwatch is connected to while devices
// go silent, as a hung machine or a partition would: the connection stays open and nothing
// answers on it, so only sigwatch's own pings can tell. sigwatch must move to a live node within
// seconds, and the events of the devices silenced meanwhile must be stored while the node is
// still frozen; after it resumes, every silenced device is lost exactly once, none early, and
// no live device is lost.
func TestNATSClusterFrozenNode(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true})
	cluster := testenv.NATSCluster(t)
	env.NATS = &servers.NATS{URL: cluster.URL()}
	const (
		threshold = 2 * time.Second
		stream    = "SIGWATCH"
	)
	startProc(t, env, "sigwatch", "SIGWATCH_THRESHOLDS_DEFAULT="+threshold.String(),
		"SIGWATCH_NATS_REPLICAS=3", "SIGWATCH_LOG_LEVEL=info")
	l := watchLost(t, env)
	// The test's own connection notices a frozen node quickly too.
	js, err := jetstream.New(env.Conn(t, nats.PingInterval(500*time.Millisecond), nats.MaxPingsOutstanding(2)))
	if err != nil {
		t.Fatal(err)
	}
	checkReplicas(t, js, stream, 3)
	d := startDevices(t, env.Mosquitto.URL, 300, 300*time.Millisecond)
	time.Sleep(3 * time.Second)

	silence := steadily(d)
	silence(threshold + 500*time.Millisecond)
	var frozen int
	testenv.WaitFor(t, 10*time.Second, "sigwatch connected", func() bool {
		frozen, err = cluster.ConnectedNode("sigwatch")
		return err == nil && frozen >= 0
	})
	lead, _ := cluster.StreamLeader(stream)
	if err := cluster.Pause(frozen); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := cluster.Resume(frozen); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	silence(1500 * time.Millisecond)
	testenv.WaitFor(t, 20*time.Second, "sigwatch connected to a live node", func() bool {
		// The frozen node's monitor does not answer; any other node that has sigwatch says so.
		i, _ := cluster.ConnectedNode("sigwatch")
		return i >= 0 && i != frozen
	})
	t.Logf("froze %s (sigwatch's node; stream leader %s): sigwatch on a live node %v later",
		cluster.Name(frozen), cluster.Name(max(lead, 0)), time.Since(paused).Round(time.Millisecond))
	testenv.WaitFor(t, 20*time.Second, "lost events stored for the devices silenced so far", func() bool {
		return lostStored(js, stream) >= len(d.silenced())
	})
	t.Logf("%d lost events stored %v after the freeze, the node still frozen", len(d.silenced()), time.Since(paused).Round(time.Millisecond))
	resume()

	waitAllLost(t, l, d, 30*time.Second)
	neverLiveLost(t, l, d, threshold)
	checkExactlySilenced(t, l, d, threshold)
}

// checkReplicas fails t unless stream has n replicas, as nats.replicas asked.
func checkReplicas(t *testing.T, js jetstream.JetStream, stream string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info := s.CachedInfo()
	// Replicas lists the peers other than the leader, or all of them while there is none.
	peers := map[string]bool{}
	if info.Cluster != nil {
		if info.Cluster.Leader != "" {
			peers[info.Cluster.Leader] = true
		}
		for _, p := range info.Cluster.Replicas {
			peers[p.Name] = true
		}
	}
	if info.Config.Replicas != n || len(peers) != n {
		t.Fatalf("stream %s: got %d replicas configured, %d in the cluster, want %d", stream, info.Config.Replicas, len(peers), n)
	}
}

// lostStored returns how many lost events stream holds, or -1 when it cannot say.
func lostStored(js jetstream.JetStream, stream string) int {
	return storedOn(js, stream, "sigwatch.lost.>")
}

// storedOn returns how many messages of stream match subject, or -1 when it
// cannot say.
func storedOn(js jetstream.JetStream, stream, subject string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return -1
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// storedLags reads every lost event of stream and returns, for the events whose deadline came
// before split and for the others, the median and the largest time from deadline to when the
// stream stored the event: how late the failovers made them.
func storedLags(t *testing.T, js jetstream.JetStream, stream string, split time.Time) (before, after [2]time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"sigwatch.lost.>"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lb, la []time.Duration
	stalls := 0
	for left := int(info.NumPending); left > 0; {
		batch, err := cons.Fetch(left, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var ev dispatch.Lost
			md, err := m.Metadata()
			if err != nil || json.Unmarshal(m.Data(), &ev) != nil {
				t.Fatalf("lost event %s: %v", m.Subject(), err)
			}
			deadline := time.UnixMilli(ev.Deadline)
			if deadline.Before(split) {
				lb = append(lb, md.Timestamp.Sub(deadline))
			} else {
				la = append(la, md.Timestamp.Sub(deadline))
			}
		}
		if n == 0 {
			// Right after a failover the consumer may find no responder
			// for a while: the ordered consumer starts again.
			if stalls++; stalls > 3 {
				t.Fatalf("reading %s stalled with %d lost events left: %v", stream, left, batch.Error())
			}
			time.Sleep(time.Second)
			continue
		}
		stalls = 0
		left -= n
	}
	return medianMax(lb), medianMax(la)
}

func medianMax(ls []time.Duration) [2]time.Duration {
	if len(ls) == 0 {
		return [2]time.Duration{}
	}
	sort.Slice(ls, func(a, b int) bool { return ls[a] < ls[b] })
	return [2]time.Duration{ls[len(ls)/2].Round(time.Millisecond), ls[len(ls)-1].Round(time.Millisecond)}
}

// steadily returns a function that silences one more device of d every
// 50ms for span: their deadlines fall due, and their events are published,
// one after another from a threshold later on.
func steadily(d *devices) func(span time.Duration) {
	next := 0
	return func(span time.Duration) {
		for end := time.Now().Add(span); time.Now().Before(end); next++ {
			d.silence(d.ids[next])
			time.Sleep(50 * time.Millisecond)
		}
	}
}
