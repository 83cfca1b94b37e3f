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

// overridesVersion returns a number that changes whenever overrides do.
func (s *Store) overridesVersion(ctx context.Context) (int64, error) {
	v, err := s.c.Do(ctx, s.c.B().Get().Key(s.k.OverridesVersion()).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("shard: read overrides version: %w", err)
	}
	return v, nil
}

// overrides returns every per-device threshold.
func (s *Store) overrides(ctx context.Context) (map[string]time.Duration, error) {
	return hashRecords(ctx, s, s.k.Overrides(), "overrides", func(id, v string) (string, time.Duration, bool) {
		ms, err := strconv.ParseInt(v, 10, 64)
		return id, time.Duration(ms) * time.Millisecond, err == nil && ms > 0
	})
}

// Thresholds decides how long a device may stay silent: a per-device
// override if one is set, else the threshold of its type, else the default.
// Overrides are cached and reloaded when their version in Redis changes.
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

	store     *Store
	mu        sync.RWMutex
	overrides map[string]time.Duration
	maxOver   time.Duration // the longest override
	version   int64
}

// NewThresholds returns thresholds backed by store's overrides.
func NewThresholds(store *Store, def time.Duration, byType map[string]time.Duration) *Thresholds {
	return &Thresholds{Default: def, ByType: byType, store: store, version: -1}
}

// For returns the threshold of device id of type typ.
func (t *Thresholds) For(id, typ string) time.Duration {
	t.mu.RLock()
	d, ok := t.overrides[id]
	t.mu.RUnlock()
	if ok {
		return d
	}
	return t.base(typ)
}

// ConfirmAfter returns how long an offline report of a device of type typ
// waits before the device is declared lost: its type's, else the one of
// the key "default".
func (t *Thresholds) ConfirmAfter(typ string) time.Duration {
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
	if d, ok := t.ByType[typ]; ok {
		return d
	}
	return t.Default
}

// Max returns the longest threshold in force: the default, a type's, or an
// override as last loaded.
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

// Reload reads the overrides if their version changed.
func (t *Thresholds) Reload(ctx context.Context) error {
	v, err := t.store.overridesVersion(ctx)
	if err != nil {
		return err
	}
	t.mu.RLock()
	same := v == t.version
	t.mu.RUnlock()
	if same {
		return nil
	}
	m, err := t.store.overrides(ctx)
	if err != nil {
		return err
	}
	var longest time.Duration
	for _, d := range m {
		longest = max(longest, d)
	}
	t.mu.Lock()
	t.overrides, t.maxOver, t.version = m, longest, v
	t.mu.Unlock()
	return nil
}

// Run reloads every interval until ctx is done.
func (t *Thresholds) Run(ctx context.Context, interval time.Duration, log *slog.Logger) {
	periodic.Run(ctx, interval, func(time.Time) {
		if err := t.Reload(ctx); err != nil && ctx.Err() == nil && log != nil {
			log.Warn("threshold overrides reload failed", "err", err)
		}
	})
}
