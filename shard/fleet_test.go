package shard_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/shard"
)

// Fleet counts the deadlines of every shard and the lost marks of every
// partition exactly, old and new shards alike.
func TestFleetCounts(t *testing.T) {
	ctx, s := newStore(t)
	const n = 8
	byShard := map[int][]shard.Entry{}
	for j := range 500 {
		id := fmt.Sprintf("dev-%d", j)
		byShard[shard.Of(id, n)] = append(byShard[shard.Of(id, n)], shard.Entry{ID: id, Deadline: int64(1000 + j)})
	}
	for i, es := range byShard {
		upsert(t, s, i, es...)
	}
	for j := range 37 {
		if err := s.LostMarks().Mark(ctx, fmt.Sprintf("gone-%d", j), 1000, 2000); err != nil {
			t.Fatal(err)
		}
	}
	watched, lost, err := s.Fleet(ctx, n)
	if err != nil || watched != 500 || lost != 37 {
		t.Errorf("Fleet(%d): watched %d, lost %d, err %v; want 500, 37", n, watched, lost, err)
	}
	if _, _, err := s.Fleet(ctx, 3); err == nil {
		t.Errorf("Fleet(3): no error, want a refusal of a shard count that is not a power of two")
	}
}

// WatermarkTail reads the watermark, the outage count and only the latest
// outages.
func TestWatermarkTail(t *testing.T) {
	ctx, s := newStore(t)
	if wm, n, last, err := s.Watermarks().Tail(ctx, 5); err != nil || wm != 0 || n != 0 || len(last) != 0 {
		t.Fatalf("before ingest: wm %d, n %d, last %v, err %v; want nothing", wm, n, last, err)
	}
	ms := int64(1_000_000)
	for range 8 {
		// Each step jumps 10s past a 3s gap and then moves on smoothly, so
		// each records one outage of its own.
		for _, step := range []int64{10_000, 1_000} {
			ms += step
			if _, err := s.Watermarks().Advance(ctx, ms, 3*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	wm, n, last, err := s.Watermarks().Tail(ctx, 5)
	if err != nil || wm != ms || n != 7 || len(last) != 5 {
		t.Fatalf("wm %d, n %d, last %v, err %v; want wm %d, 7 outages, the last 5", wm, n, last, err, ms)
	}
	if want := (shard.Outage{Start: ms - 11_000, End: ms - 1_000}); last[4] != want {
		t.Errorf("last outage %v, want %v", last[4], want)
	}
}
