package shard

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/sigwatch/sigwatch/internal/periodic"
)

// SetOverride sets a per-device threshold (0 removes it).
func (s *Store) SetOverride(ctx context.Context, id string, threshold time.Duration) error {
	b := s.c.B()
	var set rueidis.Completed
	if threshold <= 0 {
		set = b.Hdel().Key(s.k.Overrides()).Field(id).Build()
	} else {
		set = b.Hset().Key(s.k.Overrides()).FieldValue().FieldValue(id, strconv.FormatInt(threshold.Milliseconds(), 10)).Build()
	}
	for _, r := range s.c.DoMulti(ctx, set, b.Incr().Key(s.k.OverridesVersion()).Build()) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: set threshold override: %w", err)
		}
	}
	return nil
}

// overridesVersion returns a number that changes whenever overrides or
// run-time type settings do; found is false when Redis has none.
func (s *Store) overridesVersion(ctx context.Context) (v int64, found bool, err error) {
	v, err = s.c.Do(ctx, s.c.B().Get().Key(s.k.OverridesVersion()).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("shard: read overrides version: %w", err)
	}
	return v, true, nil
}

// overrides returns every per-device threshold.
func (s *Store) overrides(ctx context.Context) (map[string]time.Duration, error) {
	return hashRecords(ctx, s, s.k.Overrides(), "overrides", func(id, v string) (string, time.Duration, bool) {
		ms, err := strconv.ParseInt(v, 10, 64)
		return id, time.Duration(ms) * time.Millisecond, err == nil && ms > 0
	})
}

// Thresholds decides how long a device may stay silent: a per-device
// override if one is set, else the threshold of its type (set at run time,
// else configured), else the default. Overrides and run-time type settings
// are cached and reloaded when their version in Redis changes.
type Thresholds struct {
	Default time.Duration
	ByType  map[string]time.Duration
	// Confirm is, per type, the hold-down of an offline report (ConfirmAfter).
	Confirm map[string]time.Duration
	// MaxDeclared bounds the deadlines devices declare (0: DefaultThresholdsConfig's).
	MaxDeclared time.Duration
	// UntilNotice are the types whose devices report by exception and are
	// armed until further notice (Sparkplug's, unless periodic): a restore
	// re-arms them so, not under a threshold they never keep.
	UntilNotice map[string]bool

	store *Store
	// reload serialises Reload: a reload that read an older version must
	// not store it over a newer one.
	reload    sync.Mutex
	mu        sync.RWMutex
	overrides map[string]time.Duration
	types     map[string]TypeSetting // set at run time (typesettings.go)
	maxOver   time.Duration          // the longest override or run-time type threshold
	version   int64
	gen       string // the generation the version was read under
}

// NewThresholds returns thresholds backed by store's overrides.
func NewThresholds(store *Store, def time.Duration, byType map[string]time.Duration) *Thresholds {
	return &Thresholds{Default: def, ByType: byType, store: store, version: -1}
}

// For returns the threshold of device id of type typ.
func (t *Thresholds) For(id, typ string) time.Duration {
	t.mu.RLock()
	d, ok := t.overrides[id]
	set := t.types[typ]
	t.mu.RUnlock()
	if ok {
		return d
	}
	if set.Threshold > 0 {
		return set.Threshold
	}
	return t.configured(typ)
}

// ConfirmAfter returns how long an offline report of a device of type typ
// waits before the device is declared lost: one set at run time, else
// the configured one of its type, else the configured one of the key
// "default".
func (t *Thresholds) ConfirmAfter(typ string) time.Duration {
	t.mu.RLock()
	set, ok := t.types[typ]
	t.mu.RUnlock()
	if ok && set.ConfirmSet {
		return set.Confirm
	}
	if d, ok := t.Confirm[typ]; ok {
		return d
	}
	return t.Confirm["default"]
}

// Rearm returns how far ahead a restore re-arms a device of type typ
// that has no deadline left: its threshold, or the longest declared
// deadline for a type armed until further notice.
func (t *Thresholds) Rearm(id, typ string) time.Duration {
	if t.UntilNotice[typ] {
		return t.Declared()
	}
	return t.For(id, typ)
}

// Declared returns the bound of a deadline a device declares itself.
func (t *Thresholds) Declared() time.Duration {
	if t.MaxDeclared > 0 {
		return t.MaxDeclared
	}
	return DefaultThresholdsConfig().MaxDeclared
}

// base returns the threshold of a device of type typ without an override.
func (t *Thresholds) base(typ string) time.Duration {
	t.mu.RLock()
	set, ok := t.types[typ]
	t.mu.RUnlock()
	if ok && set.Threshold > 0 {
		return set.Threshold
	}
	return t.configured(typ)
}

// configured returns the threshold the configuration gives type typ.
func (t *Thresholds) configured(typ string) time.Duration {
	if d, ok := t.ByType[typ]; ok {
		return d
	}
	return t.Default
}

// Max returns the longest threshold in force: the default, a type's, or an
// override or run-time type threshold as last loaded.
func (t *Thresholds) Max() time.Duration {
	t.mu.RLock()
	m := t.maxOver
	t.mu.RUnlock()
	m = max(m, t.Default)
	for _, d := range t.ByType {
		m = max(m, d)
	}
	return m
}

// Reload reads the overrides and run-time type settings if their version
// changed, or the generation of Redis's data did (a restore may have
// written the same version number over other data).
func (t *Thresholds) Reload(ctx context.Context) error {
	t.reload.Lock()
	defer t.reload.Unlock()
	gen := t.store.Generation()
	v, found, err := t.store.overridesVersion(ctx)
	if err != nil {
		return err
	}
	t.mu.RLock()
	// A version gone under the same generation is Redis without its data:
	// what was loaded stays in force until a restore writes it back, so
	// that signals stored meanwhile are stamped with it.
	same := v == t.version && gen == t.gen || !found && t.version > 0 && gen == t.gen
	t.mu.RUnlock()
	if same {
		return nil
	}
	m, err := t.store.overrides(ctx)
	if err != nil {
		return err
	}
	types, err := t.store.typeSettings(ctx)
	if err != nil {
		return err
	}
	var longest time.Duration
	for _, d := range m {
		longest = max(longest, d)
	}
	for _, set := range types {
		longest = max(longest, set.Threshold)
	}
	t.mu.Lock()
	t.overrides, t.types, t.maxOver, t.version, t.gen = m, types, longest, v, gen
	t.mu.Unlock()
	return nil
}

// Refresh reloads whatever the version says: after a restore wrote the
// settings back.
func (t *Thresholds) Refresh(ctx context.Context) error {
	t.mu.Lock()
	t.version = -1
	t.mu.Unlock()
	return t.Reload(ctx)
}

// Run reloads every interval until ctx is done.
func (t *Thresholds) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	periodic.Run(ctx, interval, func(time.Time) {
		if err := t.Reload(ctx); err != nil && ctx.Err() == nil && log != nil {
			log.Warn("threshold overrides reload failed", "err", err)
		}
	})
}
