package shard

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// A type's thresholds may be set at run time: they sit in one HASH beside
// the per-device overrides (type -> "<threshold ms>:<confirm_after ms>",
// either part empty when unset) and share the overrides' version, so one
// read tells every cache whether to reload.

// TypeSetting is what is set at run time for one device type. A zero
// Threshold leaves the type's threshold to the configuration; ConfirmSet
// false leaves its confirm_after to it.
type TypeSetting struct {
	Threshold  time.Duration
	Confirm    time.Duration
	ConfirmSet bool
}

// IsZero reports whether s sets nothing.
func (s TypeSetting) IsZero() bool { return s.Threshold <= 0 && !s.ConfirmSet }

// encode is s as the value of its field.
func (s TypeSetting) encode() string {
	v := ""
	if s.Threshold > 0 {
		v = strconv.FormatInt(s.Threshold.Milliseconds(), 10)
	}
	v += ":"
	if s.ConfirmSet {
		v += strconv.FormatInt(s.Confirm.Milliseconds(), 10)
	}
	return v
}

// parseTypeSetting reads a field's value; ok is false for one that does
// not parse or sets nothing.
func parseTypeSetting(v string) (s TypeSetting, ok bool) {
	thr, conf, found := strings.Cut(v, ":")
	if !found {
		return s, false
	}
	if thr != "" {
		ms, err := strconv.ParseInt(thr, 10, 64)
		if err != nil || ms <= 0 {
			return s, false
		}
		s.Threshold = time.Duration(ms) * time.Millisecond
	}
	if conf != "" {
		ms, err := strconv.ParseInt(conf, 10, 64)
		if err != nil || ms < 0 {
			return s, false
		}
		s.Confirm, s.ConfirmSet = time.Duration(ms)*time.Millisecond, true
	}
	return s, !s.IsZero()
}

// writeTypeSetting stores typ's setting (a zero one removes it) and bumps
// the version the caches reload on.
func (s *Store) writeTypeSetting(ctx context.Context, typ string, set TypeSetting) error {
	b := s.c.B()
	var w rueidis.Completed
	if set.IsZero() {
		w = b.Hdel().Key(s.k.TypeSettings()).Field(typ).Build()
	} else {
		w = b.Hset().Key(s.k.TypeSettings()).FieldValue().FieldValue(typ, set.encode()).Build()
	}
	for _, r := range s.c.DoMulti(ctx, w, b.Incr().Key(s.k.OverridesVersion()).Build()) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: set thresholds of type %q: %w", typ, err)
		}
	}
	return nil
}

// typeSettings returns every type's run-time setting.
func (s *Store) typeSettings(ctx context.Context) (map[string]TypeSetting, error) {
	return hashRecords(ctx, s, s.k.TypeSettings(), "type thresholds", func(typ, v string) (string, TypeSetting, bool) {
		set, ok := parseTypeSetting(v)
		return typ, set, ok
	})
}

// RestoreTypeSettings writes the run-time settings of types as the durable
// registry keeps them, after Redis lost data, before any device is re-armed
// with its threshold.
func (s *Store) RestoreTypeSettings(ctx context.Context, types map[string]TypeSetting) error {
	b := s.c.B()
	set, n := b.Hset().Key(s.k.TypeSettings()).FieldValue(), 0
	for typ, v := range types {
		if !v.IsZero() {
			set, n = set.FieldValue(typ, v.encode()), n+1
		}
	}
	if n == 0 {
		return nil
	}
	for _, r := range s.c.DoMulti(ctx, set.Build(), b.Incr().Key(s.k.OverridesVersion()).Build()) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: restore type thresholds: %w", err)
		}
	}
	return nil
}

// Where a type's threshold or confirm_after comes from.
const (
	FromRuntime = "runtime" // PUT /v1/types/{type}
	FromConfig  = "config"  // thresholds.types, thresholds.confirm_after
	FromDefault = "default" // thresholds.default; confirm_after 0
)

// TypeView is what is in force for one device type, and where each value
// comes from (FromRuntime, FromConfig, FromDefault).
type TypeView struct {
	Type             string `json:"type"`
	Threshold        string `json:"threshold"`
	ThresholdMS      int64  `json:"threshold_ms"`
	ThresholdFrom    string `json:"threshold_from"`
	ConfirmAfter     string `json:"confirm_after"`
	ConfirmAfterMS   int64  `json:"confirm_after_ms"`
	ConfirmAfterFrom string `json:"confirm_after_from"`
}

// Type returns what is in force for type typ, as last loaded.
func (t *Thresholds) Type(typ string) TypeView {
	t.mu.RLock()
	set := t.types[typ]
	t.mu.RUnlock()
	thr, thrFrom := t.Default, FromDefault
	if d, ok := t.ByType[typ]; ok {
		thr, thrFrom = d, FromConfig
	}
	if set.Threshold > 0 {
		thr, thrFrom = set.Threshold, FromRuntime
	}
	conf, confFrom := time.Duration(0), FromDefault
	if d, ok := t.Confirm[typ]; ok {
		conf, confFrom = d, FromConfig
	}
	if set.ConfirmSet {
		conf, confFrom = set.Confirm, FromRuntime
	}
	return TypeView{Type: typ, Threshold: thr.String(), ThresholdMS: thr.Milliseconds(), ThresholdFrom: thrFrom,
		ConfirmAfter: conf.String(), ConfirmAfterMS: conf.Milliseconds(), ConfirmAfterFrom: confFrom}
}

// Types returns what is in force for every type with a setting, at run
// time or in the configuration, by name.
func (t *Thresholds) Types() []TypeView {
	names := map[string]bool{}
	t.mu.RLock()
	for typ := range t.types {
		names[typ] = true
	}
	t.mu.RUnlock()
	for typ := range t.ByType {
		names[typ] = true
	}
	for typ := range t.Confirm {
		names[typ] = true
	}
	out := make([]TypeView, 0, len(names))
	for _, typ := range slices.Sorted(maps.Keys(names)) {
		out = append(out, t.Type(typ))
	}
	return out
}

// Configured reports whether typ has a setting made at run time, as last
// loaded.
func (t *Thresholds) Configured(typ string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.types[typ]
	return ok
}

// setting returns typ's run-time setting as last loaded.
func (t *Thresholds) setting(typ string) TypeSetting {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.types[typ]
}

// overridden reports whether id has a threshold override, as last loaded.
func (t *Thresholds) overridden(id string) bool {
	t.mu.RLock()
	_, ok := t.overrides[id]
	t.mu.RUnlock()
	return ok
}
