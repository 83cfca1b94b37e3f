package shard

import (
	"context"
	"fmt"
)

// The store keeps some small records as the fields of one hash that is
// read whole: drain reports by shard, writer reports, ingest members,
// mutes, overrides, the topology. These three calls are what such a hash
// needs; op and what name the operation in the error.

// hashAll returns every field of the hash key; what names its records.
func (s *Store) hashAll(ctx context.Context, key, what string) (map[string]string, error) {
	m, err := s.c.Do(ctx, s.c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("shard: read %s: %w", what, err)
	}
	return m, nil
}

// hashRecords reads the hash key whole and parses each field into a record
// with parse; a field parse refuses (ok false) is left out.
func hashRecords[K comparable, R any](ctx context.Context, s *Store, key, what string, parse func(field, value string) (k K, r R, ok bool)) (map[K]R, error) {
	m, err := s.hashAll(ctx, key, what)
	if err != nil {
		return nil, err
	}
	out := make(map[K]R, len(m))
	for field, v := range m {
		if k, r, ok := parse(field, v); ok {
			out[k] = r
		}
	}
	return out, nil
}

// hashSet sets field of the hash key to value.
func (s *Store) hashSet(ctx context.Context, key, field, value, op string) error {
	if err := s.c.Do(ctx, s.c.B().Hset().Key(key).FieldValue().FieldValue(field, value).Build()).Error(); err != nil {
		return fmt.Errorf("shard: %s: %w", op, err)
	}
	return nil
}

// hashDelete deletes field of the hash key.
func (s *Store) hashDelete(ctx context.Context, key, field, op string) error {
	if err := s.c.Do(ctx, s.c.B().Hdel().Key(key).Field(field).Build()).Error(); err != nil {
		return fmt.Errorf("shard: %s: %w", op, err)
	}
	return nil
}
