package dispatch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

// openRegistry returns a publisher on env's NATS with opts and its registry.
func openRegistry(t testing.TB, env *testenv.Env, opts Options) (*Bus, *Registry) {
	t.Helper()
	p := newPublisher(t, env.Conn(t), opts)
	r, err := p.OpenRegistry(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

// records returns what Each sees, by id, failing on an id seen twice.
func records(t testing.TB, r *Registry) map[string]DeviceRecord {
	t.Helper()
	got := map[string]DeviceRecord{}
	err := r.Each(context.Background(), func(rec DeviceRecord) error {
		if _, dup := got[rec.ID]; dup {
			return fmt.Errorf("record %q seen twice", rec.ID)
		}
		got[rec.ID] = rec
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
	}
}

func deviceIDs(n int, prefix string) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
	}
	return ids
}

// TestRegistryCASLosesNoUpdate proves that concurrent updaters of one device
// lose nothing: every read-modify-write lands once, whoever it races with.
func TestRegistryCASLosesNoUpdate(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, r := openRegistry(t, env, Options{})
	ctx := context.Background()
	before := testenv.IgnoreCurrent()

	const writers, each = 2, 200
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for range writers {
		wg.Go(func() {
			for range each {
				for _, err := range r.Update(ctx, []string{"dev"}, func(rec *DeviceRecord, _ bool) (bool, bool) {
					rec.Threshold++
					return true, false
				}) {
					if err != nil {
						errs <- err
					}
				}
			}
		})
	}
	// The same id twice in one call races with itself, too.
	wg.Go(func() {
		for range each / 2 {
			for _, err := range r.Update(ctx, []string{"dev", "dev"}, func(rec *DeviceRecord, _ bool) (bool, bool) {
				rec.LostAt++
				return true, false
			}) {
				if err != nil {
					errs <- err
				}
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	rec, ok, err := r.Get(ctx, "dev")
	if err != nil || !ok {
		t.Fatalf("get: %v, present %v", err, ok)
	}
	if rec.Threshold != writers*each || rec.LostAt != each || rec.ID != "dev" {
		t.Errorf("got threshold %d, lost_at %d, id %q; want %d, %d, dev", rec.Threshold, rec.LostAt, rec.ID, writers*each, each)
	}
	testenv.VerifyNone(t, before)
}

// TestRegistryUpdateWritesOnlyWhatFnKeeps proves the three outcomes of fn:
// keep=false writes nothing (an absent device stays absent, a present one
// keeps its revision), del=true deletes, and fn sees exists and the stored
// record.
func TestRegistryUpdateWritesOnlyWhatFnKeeps(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, r := openRegistry(t, env, Options{})
	ctx := context.Background()

	noErrors(t, r.Update(ctx, []string{"a"}, func(rec *DeviceRecord, exists bool) (bool, bool) {
		if exists || rec.ID != "a" || rec.Type != "" {
			t.Errorf("absent device: got %+v, exists %v; want the zero record with its id", *rec, exists)
		}
		return false, false
	}))
	if _, ok, err := r.Get(ctx, "a"); err != nil || ok {
		t.Fatalf("after keep=false on an absent device: present %v, %v; want absent", ok, err)
	}

	noErrors(t, r.Update(ctx, []string{"a"}, func(rec *DeviceRecord, _ bool) (bool, bool) {
		rec.Type, rec.Threshold, rec.ID = "pump", 5000, "someone-else" // the id is the key's, whatever fn does
		return true, false
	}))
	_, _, seq0, _ := sizeOf(t, r)
	noErrors(t, r.Update(ctx, []string{"a"}, func(rec *DeviceRecord, exists bool) (bool, bool) {
		if !exists || rec.Type != "pump" || rec.Threshold != 5000 || rec.ID != "a" {
			t.Errorf("stored device: got %+v, exists %v; want a pump, 5000", *rec, exists)
		}
		rec.Type = "changed but not kept"
		return false, true
	}))
	if _, _, seq1, _ := sizeOf(t, r); seq1 != seq0 {
		t.Errorf("keep=false wrote: last sequence %d, want %d", seq1, seq0)
	}
	if rec, ok, err := r.Get(ctx, "a"); err != nil || !ok || rec.Type != "pump" {
		t.Errorf("got %+v %v %v, want the pump unchanged", rec, ok, err)
	}

	noErrors(t, r.Update(ctx, []string{"a", "never-seen"}, func(*DeviceRecord, bool) (bool, bool) { return true, true }))
	if _, ok, err := r.Get(ctx, "a"); err != nil || ok {
		t.Errorf("after del: present %v, %v; want absent", ok, err)
	}
	// A deleted device can be created again.
	noErrors(t, r.Update(ctx, []string{"a"}, func(rec *DeviceRecord, exists bool) (bool, bool) {
		if exists {
			t.Error("a deleted device reads as existing")
		}
		rec.Type = "again"
		return true, false
	}))
	if got := records(t, r); len(got) != 1 || got["a"].Type != "again" {
		t.Errorf("Each = %+v, want only a, again", got)
	}
}

// sizeOf returns the registry's size and the bucket stream's last sequence
// (which moves with every write).
func sizeOf(t testing.TB, r *Registry) (bytes, records, lastSeq uint64, msgs uint64) {
	t.Helper()
	b, n, err := r.Size(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.js.Stream(context.Background(), r.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return b, n, info.State.LastSeq, info.State.Msgs
}

// TestRegistryBurstOfNewDevices writes 10,000 new devices in one Update and
// reads them back with Each. It logs how long both took: a burst costs about
// one round trip per 64 devices, not one per device.
func TestRegistryBurstOfNewDevices(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, r := openRegistry(t, env, Options{})
	ctx := context.Background()
	ids := deviceIDs(10_000, "burst")

	start := time.Now()
	noErrors(t, r.Update(ctx, ids, func(rec *DeviceRecord, exists bool) (bool, bool) {
		if exists {
			t.Errorf("%s exists before its first sight", rec.ID)
		}
		rec.Type = "meter"
		return true, false
	}))
	took := time.Since(start)
	start = time.Now()
	got := records(t, r)
	read := time.Since(start)
	t.Logf("Update of %d new devices: %v (%.0f/s); Each: %v (%.0f/s)",
		len(ids), took, float64(len(ids))/took.Seconds(), read, float64(len(got))/read.Seconds())
	if len(got) != len(ids) {
		t.Fatalf("Each returned %d records, want %d", len(got), len(ids))
	}
	for _, id := range ids {
		if got[id].Type != "meter" {
			t.Fatalf("%s: got %+v, want a meter", id, got[id])
		}
	}
}

// TestRegistryEachSeesExactlyTheLiveRecords proves Each returns every live
// device once, with its latest value, and neither deleted devices nor the
// installation record.
func TestRegistryEachSeesExactlyTheLiveRecords(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, r := openRegistry(t, env, Options{})
	ctx := context.Background()
	before := testenv.IgnoreCurrent()
	ids := deviceIDs(1000, "live")
	if _, err := r.UpdateMeta(ctx, func(m *RegistryMeta) bool { m.Installed = 1; return true }); err != nil {
		t.Fatal(err)
	}
	noErrors(t, r.Update(ctx, ids, func(rec *DeviceRecord, _ bool) (bool, bool) { rec.Threshold = 1; return true, false }))
	// Each device gets a second revision; every third is then deleted.
	noErrors(t, r.Update(ctx, ids, func(rec *DeviceRecord, _ bool) (bool, bool) { rec.Threshold = 2; return true, false }))
	var gone []string
	for i := 0; i < len(ids); i += 3 {
		gone = append(gone, ids[i])
	}
	noErrors(t, r.Update(ctx, gone, func(*DeviceRecord, bool) (bool, bool) { return true, true }))

	got := records(t, r)
	if want := len(ids) - len(gone); len(got) != want {
		t.Errorf("Each returned %d records, want %d", len(got), want)
	}
	for i, id := range ids {
		rec, ok := got[id]
		switch {
		case i%3 == 0 && ok:
			t.Errorf("%s was deleted but Each returned it", id)
		case i%3 != 0 && (!ok || rec.Threshold != 2):
			t.Errorf("%s: got %+v (present %v), want threshold 2", id, rec, ok)
		}
	}

	// An empty registry, and a callback error that ends the walk.
	noErrors(t, r.Update(ctx, ids, func(*DeviceRecord, bool) (bool, bool) { return true, true }))
	if got := records(t, r); len(got) != 0 {
		t.Errorf("after deleting all: Each returned %d records, want 0", len(got))
	}
	noErrors(t, r.Update(ctx, ids[:10], func(*DeviceRecord, bool) (bool, bool) { return true, false }))
	stop := fmt.Errorf("enough")
	n := 0
	if err := r.Each(ctx, func(DeviceRecord) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("Each with a failing callback: got %v after %d calls, want %v after 1", err, n, stop)
	}
	testenv.VerifyNone(t, before)
}

// TestRegistryKeepsAnyID proves ids that are not subject tokens (wildcards,
// dots, spaces, unicode, 1 KiB long, empty) are stored and read back whole,
// that no id enters a key, and that an id JSON cannot hold is refused.
func TestRegistryKeepsAnyID(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, r := openRegistry(t, env, Options{})
	ctx := context.Background()
	ids := []string{"*", ">", "a.b.c", "a b", "tab\there", "$KV.SIGWATCH_DEVICES.meta", "meta", "d.x",
		"Ünïcødé 设备 🚨", strings.Repeat("x", 1024), "", "\x00nul"}
	noErrors(t, r.Update(ctx, ids, func(rec *DeviceRecord, _ bool) (bool, bool) {
		rec.Type = "t:" + rec.ID
		return true, false
	}))
	for _, id := range ids {
		rec, ok, err := r.Get(ctx, id)
		if err != nil || !ok || rec.ID != id || rec.Type != "t:"+id {
			t.Errorf("get %q: got %+v %v %v, want it back", id, rec, ok, err)
		}
	}
	// JSON cannot keep bytes that are not UTF-8: such an id is refused, not
	// stored as another.
	if errs := r.Update(ctx, []string{"bad\xff"}, func(*DeviceRecord, bool) (bool, bool) { return true, false }); errs[0] == nil ||
		!strings.Contains(errs[0].Error(), "UTF-8") {
		t.Errorf("an id that is not UTF-8: got %v, want refused", errs[0])
	}
	got := records(t, r)
	if len(got) != len(ids) {
		t.Errorf("Each returned %d records, want %d", len(got), len(ids))
	}
	for _, id := range ids {
		if got[id].Type != "t:"+id {
			t.Errorf("Each lost %q", id)
		}
	}
	if _, ok, err := r.Meta(ctx); err != nil || ok {
		t.Errorf("a device named meta made an installation record: %v %v", ok, err)
	}
	keys, err := r.kv.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if len(k) != len("d.")+32 || !strings.HasPrefix(k, "d.") {
			t.Errorf("key %q, want d. and 32 hex digits", k)
		}
	}
}

// TestRegistryMetaCAS proves the installation record is absent until first
// written, and that concurrent UpdateMeta calls lose no change.
func TestRegistryMetaCAS(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, r := openRegistry(t, env, Options{})
	ctx := context.Background()
	if _, ok, err := r.Meta(ctx); err != nil || ok {
		t.Fatalf("a new bucket: meta present %v, %v; want absent", ok, err)
	}
	if m, err := r.UpdateMeta(ctx, func(*RegistryMeta) bool { return false }); err != nil || m != (RegistryMeta{}) {
		t.Fatalf("keep=false on no record: got %+v, %v; want the zero record", m, err)
	}
	if _, ok, _ := r.Meta(ctx); ok {
		t.Fatal("keep=false created the record")
	}

	const writers, each = 4, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for range each {
				m, err := r.UpdateMeta(ctx, func(m *RegistryMeta) bool {
					if m.Installed == 0 {
						m.Installed, m.Shards = int64(1000+w), 8
					}
					m.Epoch++
					return true
				})
				if err != nil || m.Epoch == 0 {
					t.Errorf("update meta: got %+v, %v", m, err)
				}
			}
		})
	}
	wg.Wait()
	m, ok, err := r.Meta(ctx)
	if err != nil || !ok {
		t.Fatalf("meta: present %v, %v", ok, err)
	}
	if m.Epoch != writers*each || m.Installed < 1000 || m.Shards != 8 {
		t.Errorf("got %+v, want epoch %d, installed by one writer, 8 shards", m, writers*each)
	}
	got, err := r.UpdateMeta(ctx, func(m *RegistryMeta) bool { m.Shards = 99; return false })
	if err != nil || got != m {
		t.Errorf("keep=false: got %+v, %v; want the stored %+v", got, err, m)
	}
	if got := records(t, r); len(got) != 0 {
		t.Errorf("Each returned the meta record: %+v", got)
	}
}

// TestRegistryRefusedInCoreMode proves core NATS, which has no storage, gets
// a refusal that says what to change.
func TestRegistryRefusedInCoreMode(t *testing.T) {
	nc, _ := natsConn(t)
	p := newPublisher(t, nc, Options{Mode: Core})
	r, err := p.OpenRegistry(context.Background())
	if r != nil || err == nil || !strings.Contains(err.Error(), "jetstream") {
		t.Errorf("got %v, %v; want a refusal that names jetstream", r, err)
	}
}

// TestRegistrySurvivesARestart proves the registry is durable: the bucket is
// file-backed with history 1, and after the NATS server restarts a reopened
// registry holds the devices and the installation record. A storage change
// the bucket cannot take is refused.
func TestRegistrySurvivesARestart(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	ctx := context.Background()
	_, r := openRegistry(t, env, Options{Stream: "FLEET"})
	ids := deviceIDs(100, "durable")
	noErrors(t, r.Update(ctx, ids, func(rec *DeviceRecord, _ bool) (bool, bool) {
		rec.Type, rec.LostDeadline, rec.LostAt, rec.Alarm = "pump", 42, 43, `{"state":"raised"}`
		return true, false
	}))
	if _, err := r.UpdateMeta(ctx, func(m *RegistryMeta) bool {
		*m = RegistryMeta{Installed: 7, Generation: "g1", Shards: 16, Prev: 8, Epoch: 3}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	s, err := r.js.Stream(ctx, "KV_FLEET_DEVICES")
	if err != nil {
		t.Fatalf("bucket FLEET_DEVICES: %v", err)
	}
	if cfg := s.CachedInfo().Config; cfg.Storage != jetstream.FileStorage || cfg.MaxMsgsPerSubject != 1 {
		t.Errorf("bucket storage %v, history %d; want file, 1", cfg.Storage, cfg.MaxMsgsPerSubject)
	}

	if err := env.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	_, r = openRegistry(t, env, Options{Stream: "FLEET"})
	got := records(t, r)
	if len(got) != len(ids) {
		t.Errorf("after a restart: %d records, want %d", len(got), len(ids))
	}
	if rec := got[ids[7]]; rec != (DeviceRecord{ID: ids[7], Type: "pump", LostDeadline: 42, LostAt: 43, Alarm: `{"state":"raised"}`}) {
		t.Errorf("after a restart: got %+v", rec)
	}
	if m, ok, err := r.Meta(ctx); err != nil || !ok || m.Generation != "g1" || m.Shards != 16 {
		t.Errorf("after a restart: meta %+v %v %v", m, ok, err)
	}

	p, err := New(ctx, env.Conn(t), Options{Stream: "FLEET2", Prefix: "fleet2", Storage: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.OpenRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	p, err = New(ctx, env.Conn(t), Options{Stream: "FLEET2", Prefix: "fleet2", Storage: "file"})
	if err == nil {
		_, err = p.OpenRegistry(ctx)
	}
	if err == nil || !strings.Contains(err.Error(), "storage") {
		t.Errorf("a storage change: got %v, want a refusal that names the storage", err)
	}
}

// TestRegistryFollowsReplicas proves an existing bucket is brought to
// nats.replicas at open, like the stream: on a single server, asking for
// three replicas reaches the server and is refused, with the numbers.
func TestRegistryFollowsReplicas(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	p, _ := openRegistry(t, env, Options{})
	// The stream of a single server cannot take three replicas either, so
	// only the registry is asked to.
	p.opts.Replicas = 3
	r, err := p.OpenRegistry(context.Background())
	if r != nil || err == nil || !strings.Contains(err.Error(), "apply replicas 3 (it has 1)") {
		t.Errorf("got %v, %v; want the bucket asked for 3 replicas", r, err)
	}
}

// TestRegistrySize logs what a device costs in the bucket.
func TestRegistrySize(t *testing.T) {
	env := testenv.New(t, testenv.Options{NATS: true})
	_, r := openRegistry(t, env, Options{})
	ctx := context.Background()
	const n = 10_000
	noErrors(t, r.Update(ctx, deviceIDs(n, "sensor-building-7-floor-3"), func(rec *DeviceRecord, _ bool) (bool, bool) {
		rec.Type, rec.Threshold = "thermostat", 300_000
		return true, false
	}))
	bytes, records, err := r.Size(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if records != n {
		t.Errorf("got %d records, want %d", records, n)
	}
	t.Logf("%d devices (id %d bytes, type and threshold set): %d bytes, %.0f bytes per record",
		n, len(deviceIDs(1, "sensor-building-7-floor-3")[0]), bytes, float64(bytes)/float64(records))
}

// BenchmarkRegistryUpdate measures first sight of new devices, in bursts of
// 10,000.
func BenchmarkRegistryUpdate(b *testing.B) {
	env := testenv.New(b, testenv.Options{NATS: true})
	_, r := openRegistry(b, env, Options{})
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		noErrors(b, r.Update(ctx, deviceIDs(10_000, fmt.Sprintf("bench-%d", i)), func(rec *DeviceRecord, _ bool) (bool, bool) {
			rec.Type = "meter"
			return true, false
		}))
	}
	b.ReportMetric(float64(b.N*10_000)/b.Elapsed().Seconds(), "devices/s")
}

// BenchmarkRegistryEach measures reading a registry of 100,000 devices.
func BenchmarkRegistryEach(b *testing.B) {
	env := testenv.New(b, testenv.Options{NATS: true})
	_, r := openRegistry(b, env, Options{})
	ctx := context.Background()
	const n = 100_000
	noErrors(b, r.Update(ctx, deviceIDs(n, "each"), func(rec *DeviceRecord, _ bool) (bool, bool) {
		rec.Type = "meter"
		return true, false
	}))
	b.ResetTimer()
	for b.Loop() {
		if got := records(b, r); len(got) != n {
			b.Fatalf("Each returned %d records, want %d", len(got), n)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
}
