package alarm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
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
// (shard.StormLoss) and its storm state as one value changed only by
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

// scopesOf lists the storm scopes of a device of group g.
func scopesOf(g string) []string {
	if g == "" {
		return []string{fleetScope}
	}
	return []string{groupScope(g), fleetScope}
}

// stormIDPrefix starts the id under which a scope's alarm keeps its state
// and timer. Device ids cannot start with "$sigwatch-".
const stormIDPrefix = "$sigwatch-storm/"

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
	raw, err := a.store.StormState(ctx, sc)
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

// stormLoss counts the loss of ev in its scopes and starts the storms it
// completes. A device already back leaves the scopes instead, and so does
// one found back once its loss is counted: its recovery may have been
// handled between the two (another worker), and would have taken out
// nothing.
func (a *Alarms) stormLoss(ctx context.Context, ev dispatch.Lost, current int64) error {
	scopes := scopesOf(ev.Group)
	if current > ev.Deadline {
		return a.stormBack(ctx, []string{ev.Group}, ev.Device)
	}
	w := a.window(ev.Device, ev.Type).Milliseconds()
	counts, err := a.store.StormLoss(ctx, scopes, ev.Device, ev.Deadline, ev.Deadline-w)
	if err != nil {
		return err
	}
	after, err := a.current(ctx, ev.Device)
	if err != nil {
		return err
	}
	if after > ev.Deadline {
		return a.stormBack(ctx, []string{ev.Group}, ev.Device)
	}
	for j, sc := range scopes {
		c := counts[j]
		_, watched, ok, err := a.consider(ctx, sc, c, false)
		if err != nil {
			return err
		}
		if !ok || watched == 0 || c.Recent < a.opts.Storm.need(sc, watched) {
			continue
		}
		hold := a.hold(ev.Device, ev.Type).Milliseconds()
		err = a.stormTransition(ctx, sc, func(st *stormState, now int64) bool {
			if st.Active {
				return false
			}
			st.Active, st.Since, st.From, st.Devices, st.Watched, st.Type, st.Hold = true, now, ev.Deadline-w, c.Recent, watched, ev.Type, hold
			st.Pending = append(st.Pending, a.stormEvent(sc, st, StormStarted, now))
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// stormBack takes device id out of the lost devices of the scopes of
// groups (the group it was lost under, and the one it came back under if
// it roamed) and ends the storms that fall below their threshold — also a
// group's whose devices all roamed away: a storm ends when the devices it
// counts are back, wherever they are now.
func (a *Alarms) stormBack(ctx context.Context, groups []string, id string) error {
	var scopes []string
	for _, g := range groups {
		for _, sc := range scopesOf(g) {
			if !slices.Contains(scopes, sc) {
				scopes = append(scopes, sc)
			}
		}
	}
	counts, err := a.store.StormBack(ctx, scopes, id)
	if err != nil {
		return err
	}
	for j, sc := range scopes {
		st, watched, ok, err := a.consider(ctx, sc, counts[j], true)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		left, err := a.store.StormLostSince(ctx, sc, st.From)
		if err != nil {
			return err
		}
		if left >= a.opts.Storm.need(sc, watched) {
			continue
		}
		err = a.stormTransition(ctx, sc, func(st *stormState, now int64) bool {
			if !st.Active {
				return false
			}
			st.Active, st.Ended, st.Devices, st.Watched = false, now, left, watched
			st.Pending = append(st.Pending, a.stormEvent(sc, st, StormEnded, now))
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// consider reads the storm of scope sc from c and, when it is in the phase
// a transition could leave (going on if active, else not: ok), the scope's
// watched devices.
func (a *Alarms) consider(ctx context.Context, sc string, c shard.StormCount, active bool) (st stormState, watched int64, ok bool, err error) {
	st, err = parseStorm(c.State)
	if err != nil || st.Active != active {
		return st, 0, false, err
	}
	watched, err = a.watched(ctx, sc)
	return st, watched, err == nil, err
}

func (a *Alarms) stormEvent(sc string, st *stormState, state string, now int64) dispatch.Storm {
	scope, group := scopeName(sc)
	return dispatch.Storm{ID: StormID(sc, st.Since, state), Scope: scope, Group: group, State: state,
		Devices: st.Devices, Watched: st.Watched, Since: st.Since, At: now}
}

// stormTransition applies decide to scope sc's storm with compare-and-set
// until it sticks, then carries out what it decided. The scope alarm's
// timer is armed first, so that a crash before the notifications are out
// leaves a timer that sends them.
func (a *Alarms) stormTransition(ctx context.Context, sc string, decide func(st *stormState, now int64) bool) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		raw, err := a.store.StormState(ctx, sc)
		if err != nil {
			return err
		}
		st, err := parseStorm(raw)
		if err != nil {
			return err
		}
		now := a.opts.Now()
		next := st
		next.Pending = append([]dispatch.Storm(nil), st.Pending...)
		if !decide(&next, now.UnixMilli()) {
			return nil
		}
		next.Version++
		if err := a.arm(ctx, ScopeAlarmID(sc), now.Add(pendingRetry).UnixMilli(), now); err != nil {
			return err
		}
		b, err := json.Marshal(next)
		if err != nil {
			return err
		}
		ok, err := a.store.CompareAndSwapStorm(ctx, sc, raw, string(b), now.UnixMilli())
		if err != nil {
			return err
		}
		if ok {
			a.rememberStorm(sc, next)
			a.m.stormTransition(next)
			return a.flushStorm(ctx, sc)
		}
	}
	return fmt.Errorf("%w: storm %s", errContended, sc)
}

// flushStorm carries out the pending transitions of scope sc's storm, in
// order: its event, its alarm's raise or resolve, and at an end the wake of
// the devices still lost. Each step is idempotent, so a replica that
// repeats them after a crash, or races another, does each once.
func (a *Alarms) flushStorm(ctx context.Context, sc string) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		raw, err := a.store.StormState(ctx, sc)
		if err != nil {
			return err
		}
		st, err := parseStorm(raw)
		if err != nil || len(st.Pending) == 0 {
			return err
		}
		for _, ev := range st.Pending {
			msg, err := dispatch.Encode(a.pub.Subjects(), ev)
			if err != nil {
				return err
			}
			if err := errors.Join(a.pub.Publish(ctx, []dispatch.Message{msg})...); err != nil {
				a.m.publishErrors.Inc()
				return fmt.Errorf("alarm: storm event %s: %w", ev.ID, err)
			}
			if err := a.scopeAlarm(ctx, sc, st, ev); err != nil {
				return err
			}
			if ev.State == StormEnded {
				if err := a.wakeLost(ctx, sc, ev.At+st.Hold); err != nil {
					return err
				}
			}
		}
		next := st
		next.Pending = nil
		next.Version++
		b, err := json.Marshal(next)
		if err != nil {
			return err
		}
		ok, err := a.store.CompareAndSwapStorm(ctx, sc, raw, string(b), a.opts.Now().UnixMilli())
		if err != nil || ok {
			if ok {
				a.rememberStorm(sc, next)
			}
			return err
		}
	}
	return fmt.Errorf("%w: storm %s", errContended, sc)
}

// scopeAlarm raises (at a start) or resolves (at an end) the alarm of
// scope sc for the storm of ev. The alarm is a device alarm without a
// device: its lost deadline is the storm's start.
func (a *Alarms) scopeAlarm(ctx context.Context, sc string, st stormState, ev dispatch.Storm) error {
	id := ScopeAlarmID(sc)
	now := a.opts.Now()
	m := a.machine(id, now)
	_, err := a.apply(ctx, id, now, func(s *State) (bool, error) {
		if ev.State == StormStarted {
			return m.lost(s, ev.Since, st.Type, 0), nil
		}
		return m.recovered(s, ev.Since, st.Type), nil
	})
	return err
}

// wakeLost arms the timers of the devices of scope sc still lost at the
// end of its storm for at: each is then raised unless it came back.
func (a *Alarms) wakeLost(ctx context.Context, sc string, at int64) error {
	now := a.opts.Now()
	return a.store.StormLostMembers(ctx, sc, func(ids []string) error {
		var wg sync.WaitGroup
		errs := make([]error, len(ids))
		sem := make(chan struct{}, a.opts.Workers)
		for j, id := range ids {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				errs[j] = a.arm(ctx, id, at, now)
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	})
}

// StormView is what the API shows of a storm.
type StormView struct {
	ID      string `json:"id"` // the id of its started event
	Scope   string `json:"scope"`
	Group   string `json:"group,omitempty"`
	State   string `json:"state"` // active or ended
	Devices int64  `json:"devices"`
	Watched int64  `json:"watched"`
	Since   int64  `json:"since"`
	Ended   int64  `json:"ended,omitempty"`
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
	scopes, raws, err := a.store.StormScopes(ctx, cmp.Or(limit, 100))
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
			Devices: st.Devices, Watched: st.Watched, Since: st.Since}
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
func (a *Alarms) AckScope(ctx context.Context, group string, until time.Time) (View, error) {
	sc := fleetScope
	if group != "" {
		sc = groupScope(group)
	}
	return a.Ack(ctx, ScopeAlarmID(sc), until)
}
