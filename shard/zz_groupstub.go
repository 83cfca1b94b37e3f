package shard

import "context"

// GroupSize stub (replaced by groups.go when merged).
func (s *Store) GroupSize(ctx context.Context, group string) (int64, error) {
	return s.c.Do(ctx, s.c.B().Scard().Key(s.k.prefix+":{g:"+group+"}:members").Build()).AsInt64()
}
