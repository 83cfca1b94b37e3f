package queue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sigwatch/sigwatch/shard"
)

// fencer is a test Fencer that hands out increasing fences.
type fencer struct{ n atomic.Uint64 }

func (f *fencer) Fence(context.Context, shard.Lease) (uint64, error) { return f.n.Add(1), nil }

// TestFencedBatchSettlesNothing proves the engine's side of invariant 11:
// each lease is fenced before its first claim and every batch carries that
// fence; a batch the handler reports fenced out settles nothing (even what
// the handler says it handled) and the loop gives up its lease, so that
// the shard is taken again under a new fence.
func TestFencedBatchSettlesNothing(t *testing.T) {
	h := newHarness(t)
	h.add(shard.Entry{ID: "d1", Deadline: 1}, shard.Entry{ID: "d2", Deadline: 1})
	var (
		mu     sync.Mutex
		fences []uint64
		sizes  []int
	)
	hd := &handler{fire: func(b Batch) ([]shard.Entry, []shard.Move, error) {
		mu.Lock()
		defer mu.Unlock()
		fences = append(fences, b.Fence)
		sizes = append(sizes, len(b.Due))
		if len(fences) == 1 {
			return b.Due, nil, fmt.Errorf("publish refused: %w", ErrFenced)
		}
		return b.Due, nil, nil
	}}
	f := &fencer{}
	h.runUntil(hd, func(o *Options) { o.Fencer = f }, "the batch fired under a second fence", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fences) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if fences[0] != 1 || fences[1] != 2 {
		t.Errorf("batches carried fences %v, want 1 then 2 (a new fence after the fenced-out batch)", fences)
	}
	if sizes[1] != 2 {
		t.Errorf("the batch after the fenced-out one had %d entries, want 2: the fenced-out batch settled something", sizes[1])
	}
	if _, ok := h.score("d1"); ok {
		t.Errorf("d1 still due after the batch under the second fence was handled")
	}
}
