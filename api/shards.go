package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/stats"
)

// Shard is one shard in GET /v1/shards.
type Shard struct {
	Shard        int    `json:"shard"`
	Size         int64  `json:"size"`
	HeadDeadline int64  `json:"head_deadline,omitempty"`
	HeadLagMS    int64  `json:"head_lag_ms"`
	Owner        string `json:"owner"`
	// Timers and TimersOwner are the shard's generic timers and the
	// holder of their lease.
	Timers      int64  `json:"timers"`
	TimersOwner string `json:"timers_owner"`
}

// Shards is GET /v1/shards, and what sigwatch shards status shows.
type Shards struct {
	shard.Topology
	Watermark    int64       `json:"watermark"`
	WatermarkLag int64       `json:"watermark_lag_ms"`
	Drain        stats.Drain `json:"drain"`
	Devices      int64       `json:"devices"`
	// GenericTimers counts the generic timers in the same shards.
	GenericTimers int64   `json:"timers"`
	List          []Shard `json:"list"`
	// Timers is the topology of the alarm's repeat timers (absent before
	// the alarm role first ran), with the number of timers.
	Timers *AlarmTimers `json:"alarm_timers,omitempty"`
}

// AlarmTimers is the alarm's repeat timer queue in GET /v1/shards.
type AlarmTimers struct {
	shard.Topology
	Size int64 `json:"size"`
}

// ShardsStatus reads the topology, its drain and every shard at now. The
// API serves it; sigwatch shards status calls it on Redis directly.
func ShardsStatus(ctx context.Context, store *shard.Store, now time.Time) (Shards, error) {
	t, err := store.Topology(ctx)
	if err != nil {
		return Shards{}, err
	}
	wm, _, err := store.Watermarks().Read(ctx)
	if err != nil {
		return Shards{}, err
	}
	v := Shards{Topology: t, Watermark: wm}
	if wm > 0 {
		v.WatermarkLag = now.UnixMilli() - wm
	}
	if v.Drain, err = stats.DrainOf(ctx, store, t, now); err != nil {
		return v, err
	}
	timers := store.Sub("alarm")
	if rt, err := timers.Topology(ctx); err == nil {
		v.Timers = &AlarmTimers{Topology: rt}
		sts, err := timers.Status(ctx, shard.Repeats, rt.Shards)
		if err != nil {
			return v, err
		}
		for _, st := range sts {
			v.Timers.Size += st.Size
		}
	}
	sts, err := store.Status(ctx, shard.Deadlines, t.Shards)
	if err != nil {
		return v, err
	}
	tsts, err := store.Leases("timers").Status(ctx, shard.Timers, t.Shards)
	if err != nil {
		return v, err
	}
	for j, st := range sts {
		sv := Shard{Shard: st.Shard, Size: st.Size, Owner: st.Owner, Timers: tsts[j].Size, TimersOwner: tsts[j].Owner}
		v.GenericTimers += tsts[j].Size
		if st.HasHead {
			sv.HeadDeadline = st.Head.Deadline
			if lag := now.UnixMilli() - st.Head.Deadline; lag > 0 {
				sv.HeadLagMS = lag
			}
		}
		v.Devices += sv.Size
		v.List = append(v.List, sv)
	}
	return v, nil
}

// Double starts a doubling of the deadlines' shards at now (Redis time,
// the clock the drain compares with) and of the alarm's repeat timers
// with them, so both keep one shard count. note says what became of the
// timers ("" when the alarm role never ran). A doubling of the timers
// drains as their moved timers fire (up to the longest repeat interval or
// ack); while it does, the next doubling of the deadlines leaves the
// timers behind, which costs nothing but balance: each queue has its own
// topology. The API serves it; sigwatch shards double calls it directly.
func Double(ctx context.Context, store *shard.Store, now time.Time) (t shard.Topology, note string, err error) {
	if t, err = store.Double(ctx, now); err != nil {
		return t, "", err
	}
	timers := store.Sub("alarm")
	rt, err := timers.Topology(ctx)
	switch {
	case err != nil:
		return t, "", nil // no alarm role yet: its timers start with the deadlines' count
	case rt.Shards >= t.Shards:
		return t, "", nil
	}
	nt, err := timers.Double(ctx, now)
	switch {
	case errors.Is(err, shard.ErrDraining):
		return t, fmt.Sprintf("alarm repeat timers: their previous doubling still drains; they stay at %d shards until a later doubling", rt.Shards), nil
	case err != nil:
		return t, "alarm repeat timers not doubled: " + err.Error(), nil
	}
	return t, fmt.Sprintf("alarm repeat timers: doubling %d -> %d shards started (epoch %d).", nt.Prev, nt.Shards, nt.Epoch), nil
}

// postShardsDouble is POST /v1/shards/double: 200 with the new topology, 409
// while a previous doubling drains.
func (a *API) postShardsDouble(w http.ResponseWriter, r *http.Request) {
	t, note, err := Double(r.Context(), a.o.Store, a.o.Now())
	if err != nil {
		writeErr(w, err)
		return
	}
	if note != "" {
		a.o.Log.Info(note)
	}
	writeJSON(w, http.StatusOK, Doubling{Topology: t, Note: note})
}

// Doubling is POST /v1/shards/double's answer: the new topology, and what
// became of the alarm's repeat timers when that needs saying.
type Doubling struct {
	shard.Topology
	Note string `json:"note,omitempty"`
}

func (a *API) getShards(w http.ResponseWriter, r *http.Request) {
	v, err := ShardsStatus(r.Context(), a.o.Store, a.o.Now())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
