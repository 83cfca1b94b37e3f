package main

import (
	"context"
	"net/http"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// shardView is one shard in GET /v1/shards.
type shardView struct {
	Shard        int    `json:"shard"`
	Size         int64  `json:"size"`
	HeadDeadline int64  `json:"head_deadline,omitempty"`
	HeadLagMS    int64  `json:"head_lag_ms"`
	Owner        string `json:"owner"`
}

// shardsView is GET /v1/shards.
type shardsView struct {
	shard.Topology
	Watermark    int64       `json:"watermark"`
	WatermarkLag int64       `json:"watermark_lag_ms"`
	Drain        drainView   `json:"drain"`
	Devices      int64       `json:"devices"`
	List         []shardView `json:"list"`
	// Timers is the topology of the alarm's repeat timers (absent before
	// the alarm role first ran), with the number of timers.
	Timers *timersView `json:"alarm_timers,omitempty"`
}

// timersView is the alarm's repeat timer queue in GET /v1/shards.
type timersView struct {
	shard.Topology
	Size int64 `json:"size"`
}

func shardsStatus(ctx context.Context, store *shard.Store, now time.Time) (shardsView, error) {
	t, err := store.Topology(ctx)
	if err != nil {
		return shardsView{}, err
	}
	wm, _, err := store.Watermark(ctx)
	if err != nil {
		return shardsView{}, err
	}
	v := shardsView{Topology: t, Watermark: wm}
	if wm > 0 {
		v.WatermarkLag = now.UnixMilli() - wm
	}
	if v.Drain, err = drainStatus(ctx, store, now); err != nil {
		return v, err
	}
	timers := store.Alarm()
	if rt, err := timers.Topology(ctx); err == nil {
		v.Timers = &timersView{Topology: rt}
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
	for _, st := range sts {
		sv := shardView{Shard: st.Shard, Size: st.Size, Owner: st.Owner}
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

func (a *App) getShards(w http.ResponseWriter, r *http.Request) {
	v, err := shardsStatus(r.Context(), a.store, time.Now())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}
