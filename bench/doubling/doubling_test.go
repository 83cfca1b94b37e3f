package doubling

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestMeasure runs a small measurement: the doubling drains under load,
// nothing falls due, and every phase wrote something. It asserts no
// timing: the figures are the bench harness's business.
func TestMeasure(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	res, err := Measure(context.Background(), Options{Store: shard.NewStore(c, shard.NewKeys("sw")),
		Devices: 5000, Writers: 2, Batch: 200, Threshold: 3 * time.Second, Phase: time.Second, Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.From != 8 || res.To != 16 {
		t.Errorf("got doubling %d -> %d, want 8 -> 16", res.From, res.To)
	}
	if res.Before <= 0 || res.During <= 0 || res.After <= 0 {
		t.Errorf("got rates %.0f, %.0f, %.0f; want every phase to write", res.Before, res.During, res.After)
	}
	if res.Fired != 0 {
		t.Errorf("%d timers fell due, want none: every device kept signalling", res.Fired)
	}
	if res.FirstSeen == 0 {
		t.Errorf("no first-seen write during the drain, want the moved devices recorded")
	}
}
