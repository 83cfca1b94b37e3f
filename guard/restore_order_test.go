package guard_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestRestoreStopsWholeShardsFirst: when the loss leaves some shards whole
// (here only the generation record goes, as when one node of a Redis
// Cluster is lost), claims under the old generation are refused from the
// start of the restore, before it reads the history it rebuilds from, not
// only at its end: a device fired meanwhile would be missing from that
// history, re-armed as live, and fire twice.
func TestRestoreStopsWholeShardsFirst(t *testing.T) {
	r := newRig(t)
	ctx := t.Context()
	g := r.guard(t)
	recs := make([]dispatch.DeviceRecord, 2000)
	for j := range recs {
		recs[j] = dispatch.DeviceRecord{ID: fmt.Sprintf("dev-%05d", j)}
	}
	r.add(t, recs)
	lease, ok, err := r.store.Acquire(ctx, 0, "test", time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquire shard 0: %v %v", ok, err)
	}
	claim := func() error {
		_, err := r.store.Claim(ctx, shard.Deadlines, 0, lease, time.Now().UnixMilli(), 10, time.Now())
		return err
	}
	if err := claim(); err != nil {
		t.Fatalf("claim before the loss: %v", err)
	}

	defer r.run(t, g)()

	key := shard.NewKeys("sw").Generation()
	if out, err := exec.Command("redis-cli", "-p", r.env.Redis.Addr[strings.LastIndex(r.env.Redis.Addr, ":")+1:], "DEL", key).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli DEL %s: %v %s", key, err, out)
	}
	testenv.WaitFor(t, 5*time.Second, "the loss noticed", func() bool { ok, _ := g.Ready(); return !ok })
	var refused, restored time.Time
	testenv.WaitFor(t, 30*time.Second, "the restore", func() bool {
		if ok, _ := g.Ready(); ok {
			restored = time.Now()
			return true
		}
		if err := claim(); errors.Is(err, shard.ErrDataLoss) && refused.IsZero() {
			refused = time.Now()
		}
		return false
	})
	if refused.IsZero() {
		t.Fatal("claims under the old generation went on succeeding throughout the restore")
	}
	if d := restored.Sub(refused); d < 300*time.Millisecond {
		t.Fatalf("claims under the old generation refused only %v before the restore ended, want from its start (at least 300ms)", d)
	}
}
