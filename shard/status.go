package shard

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Status is what one shard of one family holds and who owns it, as
// `GET /v1/shards` and `sigwatch shards status` show it.
type Status struct {
	Shard int
	Size  int64 // members
	// Head is the earliest member, if HasHead.
	Head    Entry
	HasHead bool
	// Owner is the id of the process holding the lease ("" when free) and
	// Token the lease's fencing token.
	Owner string
	Token int64
}

// Status reads the size, head and lease of each of the n shards of family
// f, all in one round trip.
func (s *Store) Status(ctx context.Context, f Family, n int) ([]Status, error) {
	if err := ValidCount(n); err != nil {
		return nil, fmt.Errorf("shard: status: %w", err)
	}
	b := s.c.B()
	cmds := make(rueidis.Commands, 0, 3*n)
	for i := range n {
		cmds = append(cmds,
			b.Zcard().Key(s.k.Timers(f, i)).Build(),
			s.headCmd(f, i),
			b.Get().Key(s.k.Owner(i)).Build())
	}
	rs := s.c.DoMulti(ctx, cmds...)
	out := make([]Status, n)
	for i := range out {
		size, head, owner := rs[3*i], rs[3*i+1], rs[3*i+2]
		st := Status{Shard: i}
		var err error
		if st.Size, err = size.AsInt64(); err != nil {
			return nil, fmt.Errorf("shard: status: size of shard %d: %w", i, err)
		}
		v, err := head.ToArray()
		if err != nil {
			return nil, fmt.Errorf("shard: status: head of shard %d: %w", i, err)
		}
		es, err := parseEntries(v)
		if err != nil {
			return nil, fmt.Errorf("shard: status: head of shard %d: %w", i, err)
		}
		if len(es) > 0 {
			st.Head, st.HasHead = es[0], true
		}
		lv, err := owner.ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			return nil, fmt.Errorf("shard: status: owner of shard %d: %w", i, err)
		}
		if lv != "" {
			l := Lease{Shard: i, Value: lv}
			st.Owner, st.Token = l.Owner(), l.Token()
		}
		out[i] = st
	}
	return out, nil
}
