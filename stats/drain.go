package stats

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// Drain is the progress of the doubling in force, for GET /v1/shards, GET
// /v1/stats and sigwatch shards status.
type Drain struct {
	Draining bool  `json:"draining"`
	From     int   `json:"from,omitempty"`
	To       int   `json:"to,omitempty"`
	SinceMS  int64 `json:"since,omitempty"`
	// MovedLeft is the sum of the last counts of moved devices (timers of
	// every family) the old shards hold; counted every few seconds by each
	// old shard's owner.
	MovedLeft int64 `json:"moved_left"`
	// ShardsDrained of the From old shards are checked clean behind their
	// floor; ShardsUnchecked have not been checked for this doubling yet.
	ShardsDrained   int      `json:"shards_drained"`
	ShardsUnchecked int      `json:"shards_unchecked"`
	Writers         []Writer `json:"writers"`
}

// Writer is one ingest writer and the epoch it writes with.
type Writer struct {
	Name    string `json:"name"`
	Epoch   int64  `json:"epoch"`
	AgeMS   int64  `json:"age_ms"`
	Current bool   `json:"current"` // writes with the current topology
	Gone    bool   `json:"gone"`    // silent for longer than shard.WriterTimeout
}

// DrainOf reads the progress of the doubling in force of topology t at
// now. Writers are listed whether or not a doubling drains.
func DrainOf(ctx context.Context, store *shard.Store, t shard.Topology, now time.Time) (Drain, error) {
	ws, err := store.Writers(ctx)
	if err != nil {
		return Drain{}, err
	}
	v := Drain{Writers: []Writer{}}
	for name, r := range ws {
		age := now.UnixMilli() - r.At
		v.Writers = append(v.Writers, Writer{Name: name, Epoch: r.Epoch, AgeMS: age,
			Current: r.Epoch >= t.Epoch, Gone: age > shard.WriterTimeout.Milliseconds()})
	}
	slices.SortFunc(v.Writers, func(a, b Writer) int { return strings.Compare(a.Name, b.Name) })
	if !t.Draining() {
		return v, nil
	}
	reports, err := store.DrainStates(ctx)
	if err != nil {
		return Drain{}, err
	}
	v.Draining, v.From, v.To, v.SinceMS = true, t.Prev, t.Shards, t.Since
	for i := range t.Prev {
		r, ok := reports[i]
		switch {
		case !ok || r.Epoch != t.Epoch:
			v.ShardsUnchecked++
		case r.Drained(t.Epoch):
			v.ShardsDrained++
		default:
			v.MovedLeft += r.Moved
		}
	}
	return v, nil
}
