package alarm

import (
	"context"
	"strconv"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// The durable registry keeps each alarm state too (dispatch.Registry), so
// that a Redis that loses data gets it back. Every state is queued for it
// once written (remember, in the background); a state whose notifications
// are about to be published is also written there first, and JetStream's
// ack awaited (persist): whatever was announced, a restore puts back.

// keepAlarm is the registry change that stores raw (of version) as a
// device's alarm state unless the record holds a later one. A device the
// registry does not know (removed) gets no record from its alarm: it is
// not to be watched again.
func keepAlarm(version int64, raw string) dispatch.UpdateFunc {
	return func(r *dispatch.DeviceRecord, exists bool) (bool, bool) {
		if !exists || r.Alarm != "" && stateVersion(r.Alarm) >= version {
			return false, false
		}
		r.Alarm = raw
		return true, false
	}
}

// persist writes st into the durable registry and waits until JetStream
// has it; flush calls it before it publishes st's notes.
func (a *Alarms) persist(ctx context.Context, id string, st stored) error {
	if a.opts.Registry == nil || st.raw == "" {
		return nil
	}
	if sc, ok := scopeOf(id); ok {
		return a.persistScope(ctx, sc, "", st.raw)
	}
	return a.opts.Registry.Update(ctx, []string{id}, keepAlarm(st.Version, st.raw))[0]
}

// persistScope writes a storm state and/or its scope alarm's state (""
// leaves either as it is) into scope sc's registry record, each unless
// the record holds a later one, and waits until JetStream has it.
func (a *Alarms) persistScope(ctx context.Context, sc, storm, alarm string) error {
	if a.opts.Registry == nil {
		return nil
	}
	return a.opts.Registry.UpdateStorm(ctx, sc, func(r *dispatch.StormRecord) bool {
		keep := false
		if storm != "" && (r.State == "" || stateVersion(r.State) < stateVersion(storm)) {
			r.State, keep = storm, true
		}
		if alarm != "" && (r.Alarm == "" || stateVersion(r.Alarm) < stateVersion(alarm)) {
			r.Alarm, keep = alarm, true
		}
		return keep
	})
}

// reseatScript raises rate TATs to at least the values given, after a
// restore put back notes holding send slots the empty Redis no longer
// accounts for.
//
// KEYS[j]: a TAT; ARGV[2j-1]: its lowest value; ARGV[2j]: its time to
// live, ms.
var reseatScript = shard.NewScript(`
for j = 1, #KEYS do
  local cur = tonumber(redis.call('GET', KEYS[j]) or '0')
  local v = tonumber(ARGV[2 * j - 1])
  if v > cur then redis.call('SET', KEYS[j], v, 'PX', ARGV[2 * j]) end
end
return 1`)

// reseat moves the paces past the send slots of st's pending notes, so
// that notes decided after a restore are paced behind them rather than
// beside them.
func (a *Alarms) reseat(ctx context.Context, st State, now time.Time) error {
	if !a.limited() {
		return nil
	}
	per, all := emission(a.opts.Rate).Milliseconds(), emission(a.opts.RateTotal).Milliseconds()
	ms := now.UnixMilli()
	k := a.store.Keys()
	var keys, args []string
	add := func(key string, tat int64) {
		if tat > ms {
			keys = append(keys, key)
			args = append(args, strconv.FormatInt(tat, 10), strconv.FormatInt(tat-ms+60_000, 10))
		}
	}
	for _, n := range st.Pending {
		if n.Slot == 0 || n.Muted {
			continue
		}
		if per > 0 {
			add(k.Tagged(rateTag, rateTypeLeaf+a.pub.Subjects().Token(n.Type)), n.Slot+per)
		}
		if all > 0 {
			add(k.Tagged(rateTag, rateTotalLeaf), n.Slot+all)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	return a.store.Exec(ctx, reseatScript, keys, args).Error()
}
