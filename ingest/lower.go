package ingest

import (
	"context"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// recordDeclared records, before es is written, the deadlines of es that a
// device declared itself (the scanner that fires one says so), retrying
// until it succeeds or ctx ends.
func (p *pipeline) recordDeclared(ctx context.Context, b *batch, idx map[string]int, es []shard.Entry, beat func()) bool {
	var recs []shard.Declaration
	for _, s := range b.items {
		if s.expired && s.lower == "" && es[idx[s.id]].Deadline == s.deadline {
			recs = append(recs, shard.Declaration{ID: s.id, Reason: shard.ReasonExpired, At: s.deadline, LastSeen: s.at})
		}
	}
	if len(recs) == 0 {
		return true
	}
	for attempt := 0; ; attempt++ {
		beat()
		actx, cancel := context.WithTimeout(ctx, storeTimeout)
		err := p.store.Record(actx, recs)
		cancel()
		if err == nil {
			p.m.declared.Add(float64(len(recs)))
			return true
		}
		if !p.retry(ctx, attempt, "record declared deadlines", err) {
			return false
		}
	}
}

// lowerAll applies the offline reports of b, retrying until it succeeds or
// ctx ends (a lowering is idempotent).
func (p *pipeline) lowerAll(ctx context.Context, b *batch, beat func()) bool {
	var ls []shard.Lowering
	for _, s := range b.items {
		if s.lower != "" {
			ls = append(ls, shard.Lowering{ID: s.id, Type: s.typ, Report: s.at, Reason: s.lower, Own: s.own})
		}
	}
	for attempt := 0; ; attempt++ {
		beat()
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, storeTimeout)
		lowered, err := p.devices.Lower(actx, ls)
		cancel()
		p.m.storeLatency.Observe(time.Since(start).Seconds())
		if err == nil {
			for j, l := range ls {
				p.m.offline[l.Reason].Inc()
				if lowered[j] {
					p.m.lowered[l.Reason].Inc()
				}
			}
			return true
		}
		if !p.retry(ctx, attempt, "declare devices lost", err) {
			return false
		}
	}
}
