package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// TestStaleScannerReleasedPastDuplicatesWindow proves invariant 11 with
// real processes: scanner a has handed a batch of lost events to its NATS
// client when it is frozen (SIGSTOP) and its bytes are held on the way to
// NATS; b takes a's shards and reports the devices lost, the devices come
// back, and a is released (SIGCONT, bytes delivered) after more than
// nats.duplicates. The stream must hold one lost event per deadline, no
// device may be reported lost after it came back, and no device that came
// back may carry a lost mark.
func TestStaleScannerReleasedPastDuplicatesWindow(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	const (
		threshold = 2 * time.Second
		window    = 3 * time.Second
	)
	common := []string{"SIGWATCH_THRESHOLDS_DEFAULT=" + threshold.String(), "SIGWATCH_NATS_DUPLICATES=" + window.String()}
	proxy := testenv.NewProxy(t, strings.TrimPrefix(env.NATS.URL, "nats://"))
	b := startProc(t, env, "b", append(common, "SIGWATCH_MQTT_CLIENT_ID=sigwatch-b")...)
	// a's client must not give its held connection up while the test holds
	// it: what it buffered is the point. a fires no generic timers, whose
	// traffic on the same connection would come first in the held bytes.
	a := startProc(t, env, "a", append(common, "SIGWATCH_ROLES=scanner", "SIGWATCH_NATS_URL=nats://"+proxy.Addr,
		"SIGWATCH_NATS_PING_INTERVAL=10m", "SIGWATCH_TIMERS_ENABLED=false")...)
	_ = b
	l := watchLost(t, env)
	d := startDevices(t, env.Mosquitto.URL, 200, 200*time.Millisecond)
	time.Sleep(3 * time.Second) // both replicas own shards; every device is watched

	proxy.Hold()
	for _, id := range d.ids {
		d.silence(id)
	}
	for end := time.Now().Add(20 * time.Second); !proxy.HeldContains("sigwatch.lost."); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			shards := map[int]int{}
			for _, ev := range l.Bodies(nil) {
				shards[ev.Shard]++
			}
			t.Fatalf("a handed no lost event to its NATS client within 20s; %d lost events stored, by shard %v", l.Len(), shards)
		}
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	waitAllLost(t, l, d, 20*time.Second)
	firstLost := len(l.Events())

	// The devices come back and keep signalling.
	d.mu.Lock()
	clear(d.silentAt)
	d.mu.Unlock()
	lastStored := time.Now()
	time.Sleep(window + time.Second)

	proxy.Release()
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// a's publishes land now, or are refused; then it rejoins.
	time.Sleep(4 * time.Second)

	twice := 0
	for id, n := range l.MsgIDs() {
		if n != 1 {
			twice++
			t.Errorf("lost event %s stored %d times, want 1 (invariant 11)", id, n)
		}
	}
	late := 0
	for _, ev := range l.Events() {
		if ev.At.After(lastStored) {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d lost events stored after the devices came back, want 0", late)
	}
	store := env.Store(t, "sw")
	devs, err := store.Devices(context.Background(), d.ids)
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for j, dev := range devs {
		if dev.LostDeadline != 0 {
			marked++
			if marked <= 5 {
				t.Errorf("%s is back but carries the lost mark %d:%d", d.ids[j], dev.LostDeadline, dev.LostAt)
			}
		}
	}
	if marked > 0 {
		t.Errorf("%d of %d devices that came back carry a lost mark, want 0", marked, len(d.ids))
	}
	t.Logf("%d devices silenced: %d lost events before a was released, %d after (%d ids stored twice); %d live devices marked lost",
		len(d.ids), firstLost, late, twice, marked)
}
