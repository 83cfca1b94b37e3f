package alarm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/shard"
)

// A storm is many devices of one group (a gateway, a site), or a large part
// of the fleet, lost within a short window: one cause upstream, not many
// faults. While it lasts, one group (or fleet) alarm speaks for the
// devices: their own alarms are held. Per-device lost events go out as
// ever.
//
// Each scope ("group:<name>", "fleet") keeps its lost devices in Redis
// (stormstore.go) and its storm state as one value changed only by
// compare-and-set, so replicas racing on a scope make one transition. A
// transition's notifications (the sigwatch.storm event, the scope alarm's
// raise or resolve, and at the end the wake-up of the devices still lost)
// are stored with it and carried out afterwards, idempotently, and cleared
// with another compare-and-set; the scope alarm's timer retries them after
// a crash.

// StormConfig is the storm section of sigwatch's configuration.
type StormConfig struct {
	// Enabled turns storm detection, and the hold of new alarms it needs,
	// on.
	Enabled bool `yaml:"enabled"`
	// A group is down when at least GroupFraction of its watched devices,
	// and at least GroupMin, were lost within Window.
	GroupFraction float64 `yaml:"group_fraction"`
	GroupMin      int     `yaml:"group_min"`
	// The fleet is down when more than FleetFraction of it, and at least
	// FleetMin devices, were lost within Window.
	FleetFraction float64 `yaml:"fleet_fraction"`
	FleetMin      int     `yaml:"fleet_min"`
	// Window is how close together the losses of a storm are; 0 takes the
	// threshold of the device whose loss is counted.
	Window time.Duration `yaml:"window"`
	// Hold is how long a new device alarm waits before it is raised, to
	// see whether a storm takes it in; 0 takes the window, at most a
	// minute.
	Hold time.Duration `yaml:"hold"`
}

// DefaultStormConfig is the storm section when nothing is configured.
func DefaultStormConfig() StormConfig {
	return StormConfig{Enabled: true, GroupFraction: 0.5, GroupMin: 5, FleetFraction: 0.2, FleetMin: 10}
}

// Validate refuses storm settings that cannot work.
func (c StormConfig) Validate() error {
	var errs []error
	if c.GroupFraction <= 0 || c.GroupFraction > 1 || c.FleetFraction <= 0 || c.FleetFraction >= 1 {
		errs = append(errs, errors.New("storm.group_fraction must be in (0, 1] and storm.fleet_fraction in (0, 1)"))
	}
	if c.GroupMin < 1 || c.FleetMin < 1 {
		errs = append(errs, errors.New("storm.group_min and storm.fleet_min must be at least 1"))
	}
	if c.Window < 0 || c.Hold < 0 {
		errs = append(errs, errors.New("storm.window and storm.hold must be >= 0 (0: the device's threshold)"))
	}
	return errors.Join(errs...)
}

// maxDefaultHold caps the hold taken from the window.
const maxDefaultHold = time.Minute

// Storm transitions, the "state" of a sigwatch.storm event.
const (
	StormStarted = "started"
	StormEnded   = "ended"
)

// fleetScope is the scope of the whole fleet; a group's is groupScope.
const fleetScope = "fleet"

func groupScope(g string) string { return "group:" + g }

// StormScope is the storm scope of group g: "group:<g>", or "fleet" for
// "" (the scope ScopeAlarmID, StormID and StormDevices take).
func StormScope(g string) string {
	if g == "" {
		return fleetScope
	}
	return groupScope(g)
}

// scopesOf lists the storm scopes of a device of group g.
func scopesOf(g string) []string {
	if g == "" {
		return []string{fleetScope}
	}
	return []string{groupScope(g), fleetScope}
}

// stormIDPrefix starts the id under which a scope's alarm keeps its state
// and timer. Device ids cannot start with shard.ReservedIDPrefix.
const stormIDPrefix = shard.ReservedIDPrefix + "storm/"

// ScopeAlarmID is the alarm id of a storm scope.
func ScopeAlarmID(scope string) string { return stormIDPrefix + scope }

// scopeOf returns the storm scope of an alarm id, and whether it is one.
func scopeOf(id string) (string, bool) { return strings.CutPrefix(id, stormIDPrefix) }

// scopeName splits a scope into the event's scope and group.
func scopeName(sc string) (scope, group string) {
	if g, ok := strings.CutPrefix(sc, "group:"); ok {
		return dispatch.ScopeGroup, g
	}
	return dispatch.ScopeFleet, ""
}

// stormState is a scope's storm as stored in Redis (JSON).
type stormState struct {
	Version int64 `json:"v"`
	Active  bool  `json:"active,omitempty"`
	Since   int64 `json:"since,omitempty"` // start of the storm (or the last one)
	// From is the earliest loss the storm counts (the window before the
	// loss that started it): devices lost long before, and still lost,
	// neither make nor prolong it.
	From    int64  `json:"from,omitempty"`
	Ended   int64  `json:"ended,omitempty"` // end of the last storm
	Devices int64  `json:"devices"`         // lost at the last transition
	Watched int64  `json:"watched"`
	Type    string `json:"type,omitempty"` // of the device whose loss started it
	// Hold is the hold its devices get again after its end, ms.
	Hold    int64            `json:"hold,omitempty"`
	Pending []dispatch.Storm `json:"pending,omitempty"`
}

func parseStorm(raw string) (stormState, error) {
	var st stormState
	if raw == "" {
		return st, nil
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return st, fmt.Errorf("alarm: storm state is corrupt (%q): %w", raw, err)
	}
	return st, nil
}

// StormID is the id of a storm transition's event.
func StormID(scope string, since int64, state string) string {
	return fmt.Sprintf("storm/%s@%d/%s", scope, since, state)
}

// need is how many lost devices of a scope of watched devices make a
// storm, and keep it going.
func (c StormConfig) need(sc string, watched int64) int64 {
	if sc == fleetScope {
		// More than the fraction.
		return max(int64(math.Floor(c.FleetFraction*float64(watched)))+1, int64(c.FleetMin))
	}
	return max(int64(math.Ceil(c.GroupFraction*float64(watched)-1e-9)), int64(c.GroupMin))
}

// storms caches what this process last read of each scope's storm, for the
// wakes of held alarms; transitions always read Redis.
type storms struct {
	mu      sync.Mutex
	states  map[string]cachedStorm
	watched struct {
		at    time.Time
		fleet int64
	}
}

type cachedStorm struct {
	st stormState
	at time.Time
}

// stormCacheFor is how stale a cached storm state may be for a held
// alarm's wake.
const stormCacheFor = 250 * time.Millisecond

func (a *Alarms) stormsOn() bool { return a.opts.Storm.Enabled }

// window is the storm window for a loss of device id of type typ.
func (a *Alarms) window(id, typ string) time.Duration {
	if w := a.opts.Storm.Window; w > 0 {
		return w
	}
	if a.opts.Threshold != nil {
		return a.opts.Threshold(id, typ)
	}
	return 30 * time.Second
}

// hold is how long a new alarm of device id waits before it is raised.
func (a *Alarms) hold(id, typ string) time.Duration {
	if !a.stormsOn() {
		return 0
	}
	if h := a.opts.Storm.Hold; h > 0 {
		return h
	}
	return min(a.window(id, typ), maxDefaultHold)
}

// watched counts the watched devices of scope sc.
func (a *Alarms) watched(ctx context.Context, sc string) (int64, error) {
	if sc != fleetScope {
		_, g := scopeName(sc)
		return a.store.GroupSize(ctx, g)
	}
	s := &a.storms
	s.mu.Lock()
	if time.Since(s.watched.at) < time.Second {
		n := s.watched.fleet
		s.mu.Unlock()
		return n, nil
	}
	s.mu.Unlock()
	live, lost, err := a.store.Fleet(ctx, a.topo.Current().Shards)
	if err != nil {
		return 0, err
	}
	n := live + lost
	s.mu.Lock()
	s.watched.at, s.watched.fleet = time.Now(), n
	s.mu.Unlock()
	return n, nil
}

// stormOver says what the storms over a device of group g are now.
func (a *Alarms) stormOver(ctx context.Context, g string) (storm, error) {
	var out storm
	if !a.stormsOn() {
		return out, nil
	}
	for _, sc := range scopesOf(g) {
		st, err := a.cachedStorm(ctx, sc)
		if err != nil {
			return out, err
		}
		out.active = out.active || st.Active
		out.quiet = max(out.quiet, st.Ended)
	}
	return out, nil
}

func (a *Alarms) cachedStorm(ctx context.Context, sc string) (stormState, error) {
	s := &a.storms
	s.mu.Lock()
	c, ok := s.states[sc]
	s.mu.Unlock()
	if ok && time.Since(c.at) < stormCacheFor {
		return c.st, nil
	}
	raw, err := a.readStorm(ctx, sc)
	if err != nil {
		return stormState{}, err
	}
	st, err := parseStorm(raw)
	if err != nil {
		return st, err
	}
	a.rememberStorm(sc, st)
	return st, nil
}

func (a *Alarms) rememberStorm(sc string, st stormState) {
	s := &a.storms
	s.mu.Lock()
	if s.states == nil {
		s.states = map[string]cachedStorm{}
	}
	s.states[sc] = cachedStorm{st: st, at: time.Now()}
	s.mu.Unlock()
}

// StormView is what the API shows of a storm.
type StormView struct {
	ID    string `json:"id"` // the id of its started event
	Scope string `json:"scope"`
	Group string `json:"group,omitempty"`
	State string `json:"state"` // active or ended
	// Devices and Watched are the scope's lost and watched devices at its
	// last transition (the start, or the end).
	Devices int64 `json:"devices"`
	Watched int64 `json:"watched"`
	// Lost and Size are the scope's lost and watched devices now.
	Lost int64 `json:"lost"`
	Size int64 `json:"size"`
	// Held counts, while the storm lasts, the device alarms it holds (a
	// group's storm holds its devices'; the fleet's those of devices whose
	// group has none), as the open alarms were last counted (every 2 s).
	Held  int64 `json:"held"`
	Since int64 `json:"since"`
	Ended int64 `json:"ended,omitempty"`
	// Alarm is the scope alarm's state.
	Alarm View `json:"alarm"`
}

// Storm states in a StormView.
const (
	StormActive = "active"
	StormOver   = "ended"
)

// Storms returns the active storms and the latest ended ones, up to limit,
// active first, latest first.
func (a *Alarms) Storms(ctx context.Context, limit int) ([]StormView, error) {
	scopes, raws, err := a.stormScopes(ctx, cmp.Or(limit, 100))
	if err != nil {
		return nil, err
	}
	lost, size, err := a.liveCounts(ctx, scopes)
	if err != nil {
		return nil, err
	}
	held, err := a.readHeld(ctx)
	if err != nil {
		return nil, err
	}
	var active, ended []StormView
	for j, sc := range scopes {
		st, err := parseStorm(raws[j])
		if err != nil || st.Since == 0 {
			continue
		}
		scope, group := scopeName(sc)
		v := StormView{ID: StormID(sc, st.Since, StormStarted), Scope: scope, Group: group, State: StormActive,
			Devices: st.Devices, Watched: st.Watched, Lost: lost[j], Size: size[j], Since: st.Since}
		if st.Active {
			v.Held = held[sc]
		}
		if al, ok, err := a.Get(ctx, ScopeAlarmID(sc)); err == nil && ok {
			v.Alarm = al
		}
		if !st.Active {
			v.State, v.Ended = StormOver, st.Ended
			ended = append(ended, v)
			continue
		}
		active = append(active, v)
	}
	return append(active, ended...), nil
}

// AckScope acknowledges the alarm of a group ("" for the fleet), as Ack
// does a device's.
func (a *Alarms) AckScope(ctx context.Context, group string, until time.Time, by string) (View, error) {
	return a.Ack(ctx, ScopeAlarmID(StormScope(group)), until, by)
}
