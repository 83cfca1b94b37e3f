package shard

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// The registry keeps what sigwatch knows about each device beyond its
// deadline: its type and first sighting, and a lost mark while it is lost.
// Both live in the device's registry partition (Part), so a doubling never
// moves them, and both are written only when a device is first seen, comes
// back, is lost or changes — never per signal.

// Device is what the registry knows about a device. It is written when a
// device is first seen, comes back, is lost or is changed — never per signal.
type Device struct {
	Type string
	// Group is the group the device belongs to, "" for none. It is kept in
	// the partition's group HASH (Keys.Group), not in the entry.
	Group string
	// LostDeadline is the deadline the device was declared lost at, 0 while
	// it is not lost; LostAt is when that was declared. They are kept in
	// the partition's lost marks, not in the entry.
	LostDeadline int64
	LostAt       int64
}

// lostMark is the value of a lost mark: "<deadline>:<at>", unix ms.
func lostMark(deadline, at int64) string {
	return strconv.FormatInt(deadline, 10) + ":" + strconv.FormatInt(at, 10)
}

func parseLostMark(s string) (deadline, at int64, err error) {
	dl, a, ok := strings.Cut(s, ":")
	if ok {
		if deadline, err = strconv.ParseInt(dl, 10, 64); err == nil {
			at, err = strconv.ParseInt(a, 10, 64)
		}
	}
	if !ok || err != nil {
		return 0, 0, fmt.Errorf("lost mark %q: not <deadline>:<at>", s)
	}
	return deadline, at, nil
}

// device builds a Device from a registry value (a type code) and a lost
// mark, either possibly nil (absent); its Type is left to decode from
// code.
func device(reg, lost rueidis.RedisMessage) (d Device, code string, found bool, err error) {
	if v, e := reg.ToString(); e == nil {
		found = true
		if validCode(v) {
			code = v
		}
	}
	if v, e := lost.ToString(); e == nil {
		found = true
		if d.LostDeadline, d.LostAt, err = parseLostMark(v); err != nil {
			return d, code, true, err
		}
	}
	return d, code, found, nil
}

// decodeTypes fills in the Type of each device from its code.
func (s *Store) decodeTypes(ctx context.Context, devs []Device, codes []string) error {
	types, err := s.typeNames(ctx, codes)
	if err != nil {
		return err
	}
	for j := range devs {
		devs[j].Type = types[j]
	}
	return nil
}

// Sighting is one device for SeenMulti: ID, Type and Group ("" keeps the
// group the device has) go in; the previous entry (Prev, with any lost mark
// and group; Existed false when the device is new) and Err come out.
type Sighting struct {
	ID, Type, Group string
	Prev            Device
	Existed         bool
	Err             error
}

// seenScript records a device that is first seen or back after being lost,
// clearing its lost mark. A device without a type costs no registry entry
// at all, and one with a type costs its id and a small code: at millions of
// devices the registry would otherwise double Redis's memory per device.
// An entry is written only when its type is new or changed.
//
// The device's group is only read here: its membership is written first
// and the group after (see SeenMulti).
//
// KEYS[1]: registry HASH of the device; KEYS[2]: its partition's lost marks;
// KEYS[3]: its group HASH
// ARGV[1]: device id; ARGV[2]: its type's code ("" if unknown)
// Returns: {previous registry value or nil, previous lost mark or nil,
// group or nil}.
var seenScript = NewScript(`
local old = redis.call('HGET', KEYS[1], ARGV[1])
local lost = redis.call('HGET', KEYS[2], ARGV[1])
if lost then redis.call('HDEL', KEYS[2], ARGV[1]) end
if ARGV[2] ~= '' and old ~= ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return {old or false, lost or false, redis.call('HGET', KEYS[3], ARGV[1]) or false}`)

// SeenMulti records that each device of ss was first seen or came back,
// with its type, and clears any lost mark, all in one round trip: a flush
// full of first-seen devices (a start, or a doubling's drain) costs one
// round trip, not one per device. The devices with a group then get their
// membership written (a second round trip) and, when the group changed, the
// group itself (a third): see recordGroups. It fills in ss and returns it.
func (s *Store) SeenMulti(ctx context.Context, ss []Sighting, now int64) []Sighting {
	types := make([]string, len(ss))
	for j, d := range ss {
		types[j] = d.Type
	}
	codes, err := s.typeCodesOf(ctx, types)
	if err != nil {
		for j := range ss {
			ss[j].Prev, ss[j].Existed, ss[j].Err = Device{}, false, err
		}
		return ss
	}
	execs := make([]rueidis.LuaExec, len(ss))
	for j, d := range ss {
		execs[j] = rueidis.LuaExec{Keys: []string{s.k.Registry(d.ID), s.k.Lost(d.ID), s.k.Group(d.ID)}, Args: []string{d.ID, codes[d.Type]}}
	}
	prevCodes := make([]string, len(ss))
	prev := make([]Device, len(ss))
	for j, r := range seenScript.execMulti(ctx, s.c, execs...) {
		d := &ss[j]
		d.Prev, d.Existed, d.Err = Device{}, false, nil
		v, err := r.tuple(3)
		if err == nil {
			prev[j], prevCodes[j], d.Existed, err = device(v[0], v[1])
		}
		if err == nil {
			if g, e := v[2].ToString(); e == nil {
				prev[j].Group = g
			}
		}
		if err != nil {
			d.Existed, d.Err = false, fmt.Errorf("shard: record device: %w", err)
		}
	}
	if err := s.decodeTypes(ctx, prev, prevCodes); err != nil {
		for j := range ss {
			ss[j].Err = err
		}
		return ss
	}
	for j := range ss {
		if ss[j].Err == nil {
			ss[j].Prev = prev[j]
		}
	}
	s.recordGroups(ctx, ss)
	return ss
}

// Mark records that id was declared lost at deadline.
func (m LostMarks) Mark(ctx context.Context, id string, deadline, at int64) error {
	err := m.s.c.Do(ctx, m.s.c.B().Hset().Key(m.s.k.Lost(id)).FieldValue().FieldValue(id, lostMark(deadline, at)).Build()).Error()
	if err != nil {
		return fmt.Errorf("shard: mark device lost: %w", err)
	}
	return nil
}

// clearLostScript clears the lost mark of a device if it is still the one
// set for the given deadline.
//
// KEYS[1]: lost marks of the device's partition; KEYS[2]: its registry
// partition; KEYS[3]: its group HASH
// ARGV[1]: device id; ARGV[2]: deadline, unix ms
// Returns: {registry value or nil, the mark cleared, group or nil} if a
// mark was cleared, else nil.
var clearLostScript = NewScript(`
local lost = redis.call('HGET', KEYS[1], ARGV[1])
if not lost then return false end
if tonumber(string.match(lost, '^%-?%d+')) ~= tonumber(ARGV[2]) then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
return {redis.call('HGET', KEYS[2], ARGV[1]) or false, lost, redis.call('HGET', KEYS[3], ARGV[1]) or false}`)

// Clear clears id's lost mark if it is the one set for deadline, and
// returns the device as it was; ok is false if there was no such mark.
func (m LostMarks) Clear(ctx context.Context, id string, deadline int64) (prev Device, ok bool, err error) {
	v, err := clearLostScript.exec(ctx, m.s.c, []string{m.s.k.Lost(id), m.s.k.Registry(id), m.s.k.Group(id)},
		[]string{id, strconv.FormatInt(deadline, 10)}).tuple(3)
	if rueidis.IsRedisNil(err) {
		return Device{}, false, nil
	}
	var code string
	if err == nil {
		prev, code, _, err = device(v[0], v[1])
		prev.Group, _ = v[2].ToString()
	}
	if err == nil {
		devs := []Device{prev}
		err = m.s.decodeTypes(ctx, devs, []string{code})
		prev = devs[0]
	}
	if err != nil {
		return Device{}, false, fmt.Errorf("shard: clear lost mark: %w", err)
	}
	return prev, true, nil
}

// Of reads, in one round trip, the deadline each id of ids was
// declared lost at (0 if it is not marked lost). A mark that does not parse
// reads as 0: it is no evidence of a loss.
func (m LostMarks) Of(ctx context.Context, ids []string) ([]int64, error) {
	vs, err := m.s.fields(ctx, ids, m.s.k.Lost, "read lost marks")
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(ids))
	for j, v := range vs {
		if v != "" {
			out[j], _, _ = parseLostMark(v)
		}
	}
	return out, nil
}

// fields reads, in one round trip, the field of each id of ids in the HASH
// key(id) ("" where there is none).
func (s *Store) fields(ctx context.Context, ids []string, key func(id string) string, what string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for j, id := range ids {
		cmds[j] = s.c.B().Hget().Key(key(id)).Field(id).Build()
	}
	out := make([]string, len(ids))
	for j, r := range s.c.DoMulti(ctx, cmds...) {
		v, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("shard: %s: %w", what, err)
		}
		out[j] = v
	}
	return out, nil
}

// Devices reads the registry entries and lost marks of ids in one round
// trip; a missing entry is the zero Device.
func (s *Store) Devices(ctx context.Context, ids []string) ([]Device, error) {
	devs, _, err := s.devices(ctx, ids, nil)
	return devs, err
}

// DevicesDeclared is Devices with the record (see Declaration) of each
// device's deadline in deadlines (the zero Declaration if it has none), in
// the same round trip: what firing reads.
func (s *Store) DevicesDeclared(ctx context.Context, ids []string, deadlines []int64) ([]Device, []Declaration, error) {
	if len(deadlines) != len(ids) {
		return nil, nil, fmt.Errorf("shard: %d deadlines for %d devices", len(deadlines), len(ids))
	}
	return s.devices(ctx, ids, deadlines)
}

// devices reads the registry entries of ids, and with deadlines the
// records of those deadlines, in one round trip.
func (s *Store) devices(ctx context.Context, ids []string, deadlines []int64) ([]Device, []Declaration, error) {
	decl := deadlines != nil
	if len(ids) == 0 {
		return nil, nil, nil
	}
	b := s.c.B()
	per := 3
	if decl {
		per = 4
	}
	cmds := make(rueidis.Commands, 0, per*len(ids))
	for _, id := range ids {
		cmds = append(cmds, b.Hget().Key(s.k.Registry(id)).Field(id).Build(), b.Hget().Key(s.k.Lost(id)).Field(id).Build(),
			b.Hget().Key(s.k.Group(id)).Field(id).Build())
		if decl {
			cmds = append(cmds, b.Hget().Key(s.k.InPart(id, "decl")).Field(id).Build())
		}
	}
	rs := s.c.DoMulti(ctx, cmds...)
	out := make([]Device, len(ids))
	codes := make([]string, len(ids))
	var decls []Declaration
	if decl {
		decls = make([]Declaration, len(ids))
	}
	for j := range ids {
		mine := rs[per*j : per*j+per]
		for _, r := range mine {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
				return nil, nil, fmt.Errorf("shard: read registry: %w", err)
			}
		}
		// A corrupt entry reads as unknown rather than stalling the batch
		// that holds it: the device still fires, with the default type.
		reg, _ := mine[0].ToMessage()
		lost, _ := mine[1].ToMessage()
		out[j], codes[j], _, _ = device(reg, lost)
		out[j].Group, _ = mine[2].ToString()
		if decl {
			if v, err := mine[3].ToString(); err == nil {
				decls[j] = declarationFor(ids[j], v, deadlines[j])
			}
		}
	}
	if err := s.decodeTypes(ctx, out, codes); err != nil {
		return nil, nil, err
	}
	return out, decls, nil
}

// Types reads the registered types of ids in one round trip ("" for a
// device of the default type or a corrupt entry): what firing needs, without
// the lost marks.
func (s *Store) Types(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	codes, err := s.fields(ctx, ids, s.k.Registry, "read registry")
	if err != nil {
		return nil, err
	}
	for j, c := range codes {
		if !validCode(c) {
			codes[j] = ""
		}
	}
	return s.typeNames(ctx, codes)
}

// forget removes id from the registry, its lost mark, its threshold
// override and its group. The group's membership goes first: a crash
// before the group goes leaves it to the next Forget, not a member that
// no registry entry names.
func (s *Store) forget(ctx context.Context, id string) error {
	b := s.c.B()
	if err := s.leaveGroup(ctx, id); err != nil {
		return fmt.Errorf("shard: forget device: %w", err)
	}
	for _, r := range s.c.DoMulti(ctx,
		b.Hdel().Key(s.k.Group(id)).Field(id).Build(),
		b.Hdel().Key(s.k.Registry(id)).Field(id).Build(),
		b.Hdel().Key(s.k.Lost(id)).Field(id).Build(),
		b.Hdel().Key(s.k.InPart(id, "decl")).Field(id).Build(),
		b.Hdel().Key(s.k.Overrides()).Field(id).Build(),
		b.Incr().Key(s.k.OverridesVersion()).Build()) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("shard: forget device: %w", err)
		}
	}
	return nil
}

// All calls fn with every lost mark, partition by partition.
func (m LostMarks) All(ctx context.Context, fn func(id string, deadline, at int64)) error {
	return m.s.scanParts(ctx, "lost", func(id, v string) {
		if dl, at, err := parseLostMark(v); err == nil {
			fn(id, dl, at)
		}
	})
}
