package ingest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// Invariant 8, late is not new: a persistent session's backlog, delivered
// when its member comes back, is judged by the evidence of when the broker
// had it — this member's stored watermark — not by when it arrives. A
// device lost after that evidence stays lost (the signal is acked, counted,
// not stored), one lost before it is recovered, a new device is stamped no
// later than the evidence allows; and the device's next signal, received
// after a probe of this process, recovers it.
func TestBacklogDoesNotRecoverLaterLoss(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	recovered := testenv.Record[dispatch.Recovered](t, r.nc, r.pub.Subjects().Prefix+".recovered.>")
	ctx := context.Background()
	const thr = 30 * time.Second
	const outage = 3 * time.Second
	opts := Options{ClientID: "late-a", Config: Config{OutageAfter: outage}}
	first := r.start(t, opts)
	dev := device(t, r.env.Mosquitto.URL)
	for _, id := range []string{"x", "y"} {
		publish(t, dev, "devices/"+id+"/signal", "")
	}
	first.stored(t, 2)
	first.stop(t)

	// While the member is away its session queues signals. Its watermark
	// is as a crash leaves it: stored, a minute old.
	wm := time.Now().Add(-time.Minute).UnixMilli()
	if _, _, err := r.store.Watermarks().AdvanceMember(ctx, shard.Member{ID: "late-a"}, wm, time.Now(), 0, shard.Outages{Gap: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"x", "y", "z"} {
		publish(t, dev, "devices/"+id+"/signal", "")
	}
	// Another replica declared x lost after the evidence (its last signal
	// was later than wm), and y lost before it.
	xLost, yLost := wm+thr.Milliseconds()+10_000, wm+thr.Milliseconds()-10_000
	for id, dl := range map[string]int64{"x": xLost, "y": yLost} {
		if _, err := r.store.Remove(ctx, shard.Deadlines, shard.Of(id, testShards), id); err != nil {
			t.Fatal(err)
		}
		if err := r.store.LostMarks().Mark(ctx, id, dl, dl+5); err != nil {
			t.Fatal(err)
		}
	}

	next := r.start(t, Options{ClientID: "late-a", Config: Config{OutageAfter: outage, ProbeInterval: time.Hour}})
	testenv.WaitFor(t, 10*time.Second, "the backlog handled", func() bool {
		return testutil.ToFloat64(next.m.signals)+testutil.ToFloat64(next.m.stale) >= 3
	})
	if got := testutil.ToFloat64(next.m.stale); got != 1 {
		t.Errorf("stale_signals_total = %v, want 1 (x's backlog)", got)
	}
	if _, ok := r.deadline(t, "x"); ok {
		t.Error("x is watched again: a signal older than its loss brought it back")
	}
	if marks, _ := r.store.LostMarks().Of(ctx, []string{"x", "y"}); marks[0] != xLost || marks[1] != 0 {
		t.Errorf("lost marks of x, y = %v, want [%d 0]", marks, xLost)
	}
	ev := recovered.Wait(t, 5*time.Second, "y's recovery", nil).Body
	if ev.Device != "y" || ev.LostAt != yLost {
		t.Errorf("recovered event %+v, want y lost at %d", ev, yLost)
	}
	cap := wm + outage.Milliseconds() + thr.Milliseconds()
	if got := mustDeadline(t, r, "z"); got > cap {
		t.Errorf("deadline of z = %d, want at most %d: stamped no later than the evidence (%d) + outage_after", got, cap, wm)
	}
	testenv.Never(t, 200*time.Millisecond, "a recovered event for x", func() bool {
		return len(recovered.Bodies(func(ev dispatch.Recovered) bool { return ev.Device == "x" })) > 0
	})
	next.stop(t)

	// Probes back: x's next signal is newer than its loss.
	last := r.start(t, Options{ClientID: "late-a", Config: Config{OutageAfter: outage}})
	testenv.WaitFor(t, 5*time.Second, "a probe back", func() bool { return last.src.evidence.Load() > xLost })
	publish(t, dev, "devices/x/signal", "")
	if ev := recovered.Wait(t, 5*time.Second, "x's recovery", func(ev dispatch.Recovered) bool { return ev.Device == "x" }).Body; ev.LostAt != xLost {
		t.Errorf("recovered event %+v, want lost_at %d", ev, xLost)
	}
}

// Without this member's own watermark (it never ran here, left, or timed
// out) nothing shows when its session's backlog reached the broker, so no
// backlog signal recovers a lost device; new devices are still stored.
func TestBacklogWithoutEvidenceRecoversNothing(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	r.drain = drainTimeout // the first run must leave, however loaded the machine
	recovered := testenv.Record[dispatch.Recovered](t, r.nc, r.pub.Subjects().Prefix+".recovered.>")
	ctx := context.Background()
	first := r.start(t, Options{ClientID: "late-b"})
	dev := device(t, r.env.Mosquitto.URL)
	publish(t, dev, "devices/w/signal", "")
	first.stored(t, 1)
	first.stop(t) // leaves: its watermark is gone
	if ms, _ := r.store.Watermarks().Members(ctx); len(ms) != 0 {
		t.Fatalf("members %v after a graceful stop, want none", ms)
	}
	publish(t, dev, "devices/w/signal", "")
	publish(t, dev, "devices/n/signal", "")
	// Lost long after anything this member knew of.
	lost := time.Now().Add(time.Minute).UnixMilli()
	if _, err := r.store.Remove(ctx, shard.Deadlines, shard.Of("w", testShards), "w"); err != nil {
		t.Fatal(err)
	}
	if err := r.store.LostMarks().Mark(ctx, "w", lost, lost); err != nil {
		t.Fatal(err)
	}
	next := r.start(t, Options{ClientID: "late-b", Config: Config{ProbeInterval: time.Hour}})
	testenv.WaitFor(t, 10*time.Second, "the backlog handled", func() bool {
		return testutil.ToFloat64(next.m.signals)+testutil.ToFloat64(next.m.stale) >= 2
	})
	if _, ok := r.deadline(t, "w"); ok || testutil.ToFloat64(next.m.stale) != 1 {
		t.Errorf("w watched again (%v) or stale_signals_total %v; want it refused, counted once", ok, testutil.ToFloat64(next.m.stale))
	}
	mustDeadline(t, r, "n")
	testenv.Never(t, 200*time.Millisecond, "a recovered event", func() bool { return recovered.Len() > 0 })
}

// In payload mode a device's own time is its evidence: a reading older than
// its loss does not recover it, even on a fresh connection; a newer one
// does.
func TestOldReadingDoesNotRecover(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	recovered := testenv.Record[dispatch.Recovered](t, r.nc, r.pub.Subjects().Prefix+".recovered.>")
	ctx := context.Background()
	const thr = 30 * time.Second
	run := r.start(t, Options{TimestampMode: TimestampPayload})
	testenv.WaitFor(t, 5*time.Second, "a probe back", func() bool { return run.src.evidence.Load() > 0 })
	dev := device(t, r.env.Mosquitto.URL)
	now := time.Now()
	lost := now.Add(-10 * time.Second).Add(thr).UnixMilli() // its last reading was 10s ago
	if err := r.store.LostMarks().Mark(ctx, "p", lost, lost); err != nil {
		t.Fatal(err)
	}
	ts := func(at time.Time) string { return fmt.Sprintf(`{"ts":%d}`, at.UnixMilli()) }
	publish(t, dev, "devices/p/signal", ts(now.Add(-20*time.Second)))
	testenv.WaitFor(t, 5*time.Second, "the old reading refused", func() bool { return testutil.ToFloat64(run.m.stale) == 1 })
	if _, ok := r.deadline(t, "p"); ok {
		t.Error("p watched again after a reading older than its loss")
	}
	publish(t, dev, "devices/p/signal", ts(now.Add(-5*time.Second)))
	if ev := recovered.Wait(t, 5*time.Second, "p's recovery", nil).Body; ev.LostAt != lost {
		t.Errorf("recovered event %+v, want lost_at %d", ev, lost)
	}
	if got, want := mustDeadline(t, r, "p"), now.Add(-5*time.Second).Add(thr).UnixMilli(); got != want {
		t.Errorf("deadline of p = %d, want %d", got, want)
	}
}

// redelivered is a message as the broker hands over a QoS 1 redelivery: the
// DUP flag set.
type redelivered struct {
	topic string
	acked chan struct{}
}

func (m redelivered) Duplicate() bool   { return true }
func (m redelivered) Qos() byte         { return 1 }
func (m redelivered) Retained() bool    { return false }
func (m redelivered) Topic() string     { return m.topic }
func (m redelivered) MessageID() uint16 { return 1 }
func (m redelivered) Payload() []byte   { return nil }
func (m redelivered) Ack()              { close(m.acked) }

// Invariant 8 for redeliveries: a message the broker delivers again (DUP)
// was first delivered before the connection was last lost, however much
// later it comes and whatever probes came back before it (the NATS MQTT
// listener redelivers what was unacked at a restart an ack wait later,
// behind newer probes). It recovers no lost device, and is stamped no later
// than the loss; a watched device's deadline is not pushed past it.
func TestRedeliveryIsNotNew(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	recovered := testenv.Record[dispatch.Recovered](t, r.nc, r.pub.Subjects().Prefix+".recovered.>")
	ctx := context.Background()
	const thr = 30 * time.Second
	run := r.start(t, Options{ClientID: "dup-a"})
	testenv.WaitFor(t, 5*time.Second, "a probe back", func() bool { return run.src.evidence.Load() > 0 })
	// The connection was lost a minute ago, and the device lost since.
	lostConn := time.Now().Add(-time.Minute).UnixMilli()
	run.src.breaks.noticed(lostConn)
	lost := time.Now().Add(-time.Second).UnixMilli()
	if err := r.store.LostMarks().Mark(ctx, "d", lost, lost); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"d", "fresh"} {
		m := redelivered{topic: "devices/" + id + "/signal", acked: make(chan struct{})}
		run.src.onMessage(nil, m)
		select {
		case <-m.acked:
		case <-time.After(5 * time.Second):
			t.Fatalf("redelivery of %s not acked", id)
		}
	}
	if _, ok := r.deadline(t, "d"); ok || testutil.ToFloat64(run.m.stale) != 1 {
		t.Errorf("d watched again (%v), stale_signals_total %v: a redelivery brought a lost device back", ok, testutil.ToFloat64(run.m.stale))
	}
	if got, want := mustDeadline(t, r, "fresh"), lostConn+thr.Milliseconds(); got > want {
		t.Errorf("deadline of a device first seen in a redelivery = %d, want at most %d: stamped no later than the connection loss", got, want)
	}
	testenv.Never(t, 200*time.Millisecond, "a recovered event", func() bool { return recovered.Len() > 0 })
}
