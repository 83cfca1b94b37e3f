package shard

import (
	"context"
	"time"
)

// DeviceView is what sigwatch knows about one device: its deadline, its
// registry entry, its threshold and whether it is lost.
type DeviceView struct {
	Device       string `json:"device"`
	Type         string `json:"type"`
	Watched      bool   `json:"watched"`
	Shard        int    `json:"shard"`
	Deadline     int64  `json:"deadline,omitempty"`
	LastSeen     int64  `json:"last_seen,omitempty"`
	ThresholdMS  int64  `json:"threshold_ms"`
	FirstSeen    int64  `json:"first_seen,omitempty"`
	Lost         bool   `json:"lost"`
	LostDeadline int64  `json:"lost_deadline,omitempty"`
	LostAt       int64  `json:"lost_at,omitempty"`
}

// Known reports whether the device was ever seen and is not removed.
func (v DeviceView) Known() bool { return v.Watched || v.FirstSeen != 0 || v.Lost }

// Devices are the operations on one device across its deadline, the
// registry and the thresholds, under the topology in force.
type Devices struct {
	store *Store
	topo  *Watcher
	thr   *Thresholds
}

// NewDevices returns the device operations over store.
func NewDevices(store *Store, topo *Watcher, thr *Thresholds) *Devices {
	return &Devices{store: store, topo: topo, thr: thr}
}

// Get reads the device id. Its deadline is the later of its scores in its
// shard and, while a doubling drains, its shard before it.
func (d *Devices) Get(ctx context.Context, id string) (DeviceView, error) {
	v := DeviceView{Device: id}
	for j, i := range d.topo.Current().Locate(id) {
		dl, ok, err := d.store.Score(ctx, Deadlines, i, id)
		if err != nil {
			return v, err
		}
		if j == 0 {
			v.Shard = i
		}
		if ok && dl > v.Deadline {
			v.Watched, v.Deadline, v.Shard = true, dl, i
		}
	}
	ds, err := d.store.Devices(ctx, []string{id})
	if err != nil {
		return v, err
	}
	reg := ds[0]
	v.Type, v.FirstSeen = reg.Type, reg.FirstSeen
	v.Lost, v.LostDeadline, v.LostAt = reg.LostDeadline != 0, reg.LostDeadline, reg.LostAt
	v.ThresholdMS = d.thr.For(id, reg.Type).Milliseconds()
	if v.Watched {
		v.LastSeen = v.Deadline - v.ThresholdMS
	}
	return v, nil
}

// Remove stops watching id and forgets it: its deadline in every shard
// that may hold it, its registry entry, lost mark and threshold override.
// removed says whether it was watched.
func (d *Devices) Remove(ctx context.Context, id string) (removed bool, err error) {
	for _, i := range d.topo.Current().Locate(id) {
		ok, err := d.store.Remove(ctx, Deadlines, i, id)
		if err != nil {
			return removed, err
		}
		removed = removed || ok
	}
	return removed, d.store.Forget(ctx, id)
}

// SetThreshold sets id's threshold override (0 removes it). A watched
// device gets its new deadline at once, counted from its last signal, so a
// lowered threshold takes effect without waiting out the old one: the ZADD
// GT of the next signal could not pull it back.
func (d *Devices) SetThreshold(ctx context.Context, id string, threshold time.Duration) (DeviceView, error) {
	// The last signal is read under the old threshold, before it changes.
	v, err := d.Get(ctx, id)
	if err != nil {
		return v, err
	}
	if err := d.store.SetOverride(ctx, id, threshold); err != nil {
		return v, err
	}
	if err := d.thr.Reload(ctx); err != nil {
		return v, err
	}
	v.ThresholdMS = d.thr.For(id, v.Type).Milliseconds()
	if v.Watched {
		next := v.LastSeen + v.ThresholdMS
		// Written to the device's shard under the topology in force, never
		// to a shard a doubling is draining.
		cur := Of(id, d.topo.Current().Shards)
		if err := d.store.Set(ctx, Deadlines, cur, Entry{ID: id, Deadline: next}); err != nil {
			return v, err
		}
		v.Deadline, v.Shard = next, cur
	}
	return v, nil
}
