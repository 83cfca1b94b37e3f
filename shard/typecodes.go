package shard

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/rueidis"
)

// A registry entry holds a device's type as a small code, not as text: at
// millions of devices the entry must cost little more than the id itself
// (bench scenario 5). The codes live in one HASH (type -> code and
// "#<code>" -> type), never reused; each process caches them for the
// generation it works under, since a Redis that lost data also lost them.

// typeCodes caches type codes both ways; gen is the generation they were
// read under.
type typeCodes struct {
	mu     sync.RWMutex
	gen    string
	byType map[string]string
	byCode map[string]string
}

func (s *Store) codes() *typeCodes {
	c := s.types
	g := s.Generation()
	c.mu.Lock()
	if c.gen != g || c.byType == nil {
		c.gen, c.byType, c.byCode = g, map[string]string{}, map[string]string{}
	}
	c.mu.Unlock()
	return c
}

// typeCodeScript returns the code of a type, assigning the next one if it
// has none.
//
// KEYS[1]: type codes HASH; ARGV[1]: type
var typeCodeScript = NewScript(`
local c = redis.call('HGET', KEYS[1], ARGV[1])
if c then return c end
c = tostring(redis.call('HINCRBY', KEYS[1], '#next', 1))
redis.call('HSET', KEYS[1], ARGV[1], c, '#' .. c, ARGV[1])
return c`)

// typeCode returns the code of typ ("" for the default type).
func (s *Store) typeCode(ctx context.Context, typ string) (string, error) {
	if typ == "" {
		return "", nil
	}
	c := s.codes()
	c.mu.RLock()
	code, ok := c.byType[typ]
	c.mu.RUnlock()
	if ok {
		return code, nil
	}
	code, err := typeCodeScript.exec(ctx, s.c, []string{s.k.TypeCodes()}, []string{typ}).ToString()
	if err != nil {
		return "", fmt.Errorf("shard: type code of %q: %w", typ, err)
	}
	c.mu.Lock()
	c.byType[typ], c.byCode[code] = code, typ
	c.mu.Unlock()
	return code, nil
}

// typeCodesOf returns the codes of types, in one round trip for those not
// cached.
func (s *Store) typeCodesOf(ctx context.Context, types []string) (map[string]string, error) {
	out := make(map[string]string, len(types))
	for _, t := range types {
		if _, ok := out[t]; ok {
			continue
		}
		code, err := s.typeCode(ctx, t)
		if err != nil {
			return nil, err
		}
		out[t] = code
	}
	return out, nil
}

// typeNames decodes registry values (codes) into types, reading unknown
// codes in one round trip. A code nobody knows reads as the default type.
func (s *Store) typeNames(ctx context.Context, codes []string) ([]string, error) {
	c := s.codes()
	out := make([]string, len(codes))
	var missing []string
	c.mu.RLock()
	for j, code := range codes {
		if code == "" {
			continue
		}
		if t, ok := c.byCode[code]; ok {
			out[j] = t
		} else {
			missing = append(missing, code)
		}
	}
	c.mu.RUnlock()
	if len(missing) == 0 {
		return out, nil
	}
	fields := make([]string, len(missing))
	for j, code := range missing {
		fields[j] = "#" + code
	}
	v, err := s.c.Do(ctx, s.c.B().Hmget().Key(s.k.TypeCodes()).Field(fields...).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("shard: read type codes: %w", err)
	}
	c.mu.Lock()
	for j, m := range v {
		if t, err := m.ToString(); err == nil {
			c.byCode[missing[j]], c.byType[t] = t, missing[j]
		} else if !rueidis.IsRedisNil(err) {
			c.mu.Unlock()
			return nil, fmt.Errorf("shard: read type codes: %w", err)
		}
	}
	for j, code := range codes {
		if code != "" {
			out[j] = c.byCode[code]
		}
	}
	c.mu.Unlock()
	return out, nil
}

// validCode reports whether v looks like a type code (legacy entries were
// JSON).
func validCode(v string) bool {
	_, err := strconv.ParseUint(v, 10, 32)
	return err == nil
}
