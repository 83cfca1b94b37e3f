package ingest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

func (r *rig) groups(t *testing.T, ids ...string) []string {
	t.Helper()
	gs, err := r.store.Groups(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

func (r *rig) groupSize(t *testing.T, g string) int64 {
	t.Helper()
	n, err := r.store.GroupSize(context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A group level records each first-seen device's group and its group's
// membership; a bad group is refused (dead-lettered, counted) and the
// other signals of the same stream are stored; a device back from being
// lost is recovered with the group of its signal, moving it there, and one
// back without a group keeps the one it had.
func TestGroupLevel(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	invalid := testenv.Record[dispatch.Invalid](t, r.nc, r.pub.Subjects().Invalid())
	recovered := testenv.Record[dispatch.Recovered](t, r.nc, r.pub.Subjects().Prefix+".recovered.>")
	ctx := context.Background()
	lostAt := time.Now().Add(-time.Minute).UnixMilli()
	for id, g := range map[string]string{"d5": "gw-old", "d6": "gw-9"} {
		if _, err := r.store.SetGroup(ctx, id, g); err != nil {
			t.Fatal(err)
		}
		if err := r.store.LostMarks().Mark(ctx, id, lostAt, lostAt+5); err != nil {
			t.Fatal(err)
		}
	}
	run := r.start(t, Options{Topics: []string{"sites/+/+/+/signal"}, IDLevel: 3, TypeLevel: 2, GroupLevel: new(1), Config: Config{MaxIDLen: 16}})
	dev := device(t, r.env.Mosquitto.URL)

	publish(t, dev, "sites/gw-1/pump/d1/signal", "")
	// Control characters never get past the broker; a group too long does.
	publish(t, dev, "sites/"+strings.Repeat("g", 17)+"/pump/d4/signal", "")
	publish(t, dev, "sites/gw-1/meter/d2/signal", "")
	publish(t, dev, "sites/gw-2/pump/d3/signal", "")
	publish(t, dev, "sites/gw-3/pump/d5/signal", "")
	run.stored(t, 4)
	if err := run.Signal(ctx, "d6", "", time.Time{}); err != nil {
		t.Fatal(err)
	}
	ev := invalid.Wait(t, 5*time.Second, "the bad group's invalid event", nil).Body
	if ev.Reason != "bad_group" {
		t.Errorf("invalid event reason = %q, want bad_group", ev.Reason)
	}
	if n := testutil.ToFloat64(run.m.invalid["bad_group"]); n != 1 {
		t.Errorf("invalid_total{reason=bad_group} = %v, want 1", n)
	}
	if _, ok := r.deadline(t, "d4"); ok {
		t.Errorf("d4, with a bad group, was stored")
	}
	for _, id := range []string{"d1", "d2", "d3"} {
		mustDeadline(t, r, id)
	}
	if got, want := r.groups(t, "d1", "d2", "d3", "d4", "d5", "d6"), []string{"gw-1", "gw-1", "gw-2", "", "gw-3", "gw-9"}; !slices.Equal(got, want) {
		t.Errorf("groups = %q, want %q", got, want)
	}
	for g, want := range map[string]int64{"gw-1": 2, "gw-2": 1, "gw-3": 1, "gw-old": 0, "gw-9": 1} {
		if got := r.groupSize(t, g); got != want {
			t.Errorf("GroupSize(%q) = %d, want %d", g, got, want)
		}
	}

	recovered.WaitN(t, 5*time.Second, 2, "two recovered events", nil)
	got := map[string]string{}
	for _, m := range recovered.Events() {
		got[m.Body.Device] = m.Body.Group
	}
	if got["d5"] != "gw-3" || got["d6"] != "gw-9" {
		t.Errorf("recovered groups = %v, want d5 in gw-3 (its signal's), d6 in gw-9 (the one it had)", got)
	}
}

// POST /v1/signals entries carry a group; a bad group fails the call
// before anything is stored, as a bad type does.
func TestGroupsFromSignals(t *testing.T) {
	r := newRig(t, testenv.Options{})
	run := r.start(t, Options{})
	ctx := context.Background()
	err := run.Signals(ctx, []Sig{{ID: "a1", Group: "site-a"}, {ID: "a2", Group: "site\x7fb"}})
	var se *SignalError
	if !errors.As(err, &se) || se.Index != 1 || !errors.Is(err, ErrBadGroup) {
		t.Fatalf("Signals with a bad group = %v, want a SignalError for entry 1 with ErrBadGroup", err)
	}
	if _, ok := r.deadline(t, "a1"); ok {
		t.Errorf("a1 was stored from a refused call")
	}
	if err := run.Signals(ctx, []Sig{{ID: "a1", Group: "site-a"}, {ID: "a2", Type: "pump", Group: "site-a"}, {ID: "a3"}}); err != nil {
		t.Fatal(err)
	}
	if got, want := r.groups(t, "a1", "a2", "a3"), []string{"site-a", "site-a", ""}; !slices.Equal(got, want) {
		t.Errorf("groups = %q, want %q", got, want)
	}
	if n := r.groupSize(t, "site-a"); n != 2 {
		t.Errorf("GroupSize(site-a) = %d, want 2", n)
	}
}

// Device ids starting with $sigwatch- are sigwatch's own (the alarm keys
// storms under them): refused over MQTT (dead-lettered) and the API, while
// another member's probe is still passed over silently.
func TestReservedIDPrefix(t *testing.T) {
	r := newRig(t, testenv.Options{Mosquitto: true})
	invalid := testenv.Record[dispatch.Invalid](t, r.nc, r.pub.Subjects().Invalid())
	run := r.start(t, Options{})
	dev := device(t, r.env.Mosquitto.URL)
	publish(t, dev, "devices/$sigwatch-storm-gw-1/signal", "")
	publish(t, dev, "devices/"+ProbeIDPrefix+"other/signal", "")
	publish(t, dev, "devices/ok/signal", "")
	run.stored(t, 1)
	ev := invalid.Wait(t, 5*time.Second, "the reserved id's invalid event", nil).Body
	if ev.Reason != "reserved_id" || ev.Topic != "devices/$sigwatch-storm-gw-1/signal" {
		t.Errorf("invalid event = %+v, want reason reserved_id for the storm id", ev)
	}
	testenv.Never(t, 300*time.Millisecond, "an invalid event for another member's probe", func() bool { return invalid.Len() > 1 })
	if _, ok := r.deadline(t, "$sigwatch-storm-gw-1"); ok {
		t.Errorf("the reserved id was stored")
	}
	if err := run.Signal(context.Background(), "$sigwatch-storm-fleet", "", time.Time{}); !errors.Is(err, ErrReservedID) {
		t.Errorf("Signal($sigwatch-storm-fleet) = %v, want ErrReservedID", err)
	}
	if err := shard.CheckID("$sigwatch-x", 0); !errors.Is(err, ErrReservedID) {
		t.Errorf("CheckID($sigwatch-x) = %v, want ErrReservedID", err)
	}
}

// A first-seen device's group reaches the durable registry with it: the
// group of its signal, else one set before it was first seen; a device
// back from being lost on another group is written again.
func TestGroupsReachTheDurableRegistry(t *testing.T) {
	r := newRig(t, testenv.Options{})
	ctx := context.Background()
	reg, err := r.pub.OpenRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.SetGroup(ctx, "pre", "gw-pre"); err != nil {
		t.Fatal(err)
	}
	lostAt := time.Now().Add(-time.Minute).UnixMilli()
	if _, err := r.store.SetGroup(ctx, "moved", "gw-old"); err != nil {
		t.Fatal(err)
	}
	if err := r.store.LostMarks().Mark(ctx, "moved", lostAt, lostAt+5); err != nil {
		t.Fatal(err)
	}
	run := r.start(t, Options{Registry: reg})
	if err := run.Signals(ctx, []Sig{{ID: "sig", Group: "gw-sig"}, {ID: "pre"}, {ID: "plain"}, {ID: "moved", Group: "gw-new"}}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"sig": "gw-sig", "pre": "gw-pre", "plain": "", "moved": "gw-new"} {
		rec, ok, err := reg.Get(ctx, id)
		if err != nil || !ok || rec.Group != want {
			t.Errorf("registry record of %s = %+v (found %v, %v), want group %q", id, rec, ok, err, want)
		}
	}
}
