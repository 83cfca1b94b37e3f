package shard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/backoff"
)

// A shard's loop sleeps until its head is due instead of polling, so an idle
// shard costs (almost) nothing. What makes that safe is the wake key: a
// claim that found nothing due records in it when the loop will look again
// (Claim's wakeBy, or the head if earlier), and every script that can put a
// member earlier than the head (a new device, a lowered threshold, an armed
// repeat, a timer reset or carry) runs wake with the earliest score it
// wrote. A score before the recorded time deletes the key and publishes its
// name on the family's wake channel, so the loop claims again at once; a
// later one costs one GET. Scripts are atomic, so every write either
// precedes the claim (which sees it) or follows it (and finds the key).
//
// Pub/sub is at most once, but a notice is lost only with the subscriber's
// connection, and every (re)subscription wakes every loop (Wakes): the
// loops claim again and record anew.

// wakeLua defines wake(key, at) for the scripts that write members: key is
// the shard's wake key (Keys.Wake), at the earliest score written. The
// channel is the key without its hash tag (Keys.WakeChannel).
const wakeLua = `
local function wake(key, at)
  if not at then return end
  local w = redis.call('GET', key)
  if w and at < tonumber(w) then
    redis.call('DEL', key)
    local head, tail = string.match(key, '^(.*){%d+}:(.-)$')
    redis.call('PUBLISH', head .. tail, key)
  end
end
`

// wakeKeep is how much longer than its loop's sleep a wake key is kept: it
// must outlive the sleep it stands for, and need not outlive its loop.
const wakeKeep = time.Minute

// Wakes delivers the wake notices of family f's shards to woke, with the
// shard index, until ctx is done. subscribed is called each time the
// subscription is (re)established: notices published while it was down are
// lost, so the caller then wakes every loop it runs. Both callbacks must
// not block.
func (s *Store) Wakes(ctx context.Context, f Family, subscribed func(), woke func(shard int)) {
	s.subscribe(ctx, s.k.WakeChannel(f), subscribed, func(msg string) {
		if i, ok := wakeShard(msg); ok {
			woke(i)
		}
	})
}

// subscribe delivers the messages of channel to got until ctx is done,
// subscribing again after a failure; subscribed is called each time the
// subscription stands. Neither callback may block.
func (s *Store) subscribe(ctx context.Context, channel string, subscribed func(), got func(msg string)) {
	bo := backoff.Backoff{Policy: backoff.Policy{Base: 100 * time.Millisecond, Max: 2 * time.Second}}
	sub := rueidis.WithOnSubscriptionHook(ctx, func(p rueidis.PubSubSubscription) {
		if p.Kind == "subscribe" && subscribed != nil {
			subscribed()
		}
	})
	for ctx.Err() == nil {
		err := s.c.Receive(sub, s.c.B().Subscribe().Channel(channel).Build(), func(m rueidis.PubSubMessage) { got(m.Message) })
		if err == nil {
			bo.Reset()
		}
		bo.Wait(ctx)
	}
}

// Want asks every ingest process to probe at its full rate for a
// while: a scanner has something due by the clock that waits for a later
// watermark. An idle ingest probes slower, so that a quiet installation
// costs little; see Wants.
func (w Watermarks) Want(ctx context.Context) error {
	if err := w.s.c.Do(ctx, w.s.c.B().Publish().Channel(w.s.k.WatermarkWants()).Message("1").Build()).Error(); err != nil {
		return fmt.Errorf("shard: ask for the watermark: %w", err)
	}
	return nil
}

// Wants calls wanted for each Want of any process until
// ctx is done, and subscribed (if not nil) each time the subscription
// stands. Asks made while it was down are lost; a waiting scanner asks
// again every 100ms. Neither callback may block.
func (w Watermarks) Wants(ctx context.Context, subscribed, wanted func()) {
	w.s.subscribe(ctx, w.s.k.WatermarkWants(), subscribed, func(string) { wanted() })
}

// Moves calls moved each time the watermark rises, until ctx is
// done, and subscribed (if not nil) each time the subscription stands: a
// scanner waiting for a later watermark reads it at once instead of a poll
// later. Rises announced while it was down are lost; the waiting scanner
// still polls. Neither callback may block.
func (w Watermarks) Moves(ctx context.Context, subscribed, moved func()) {
	w.s.subscribe(ctx, w.s.k.WatermarkMoves(), subscribed, func(string) { moved() })
}

// wakeShard is the shard index of a wake key.
func wakeShard(key string) (int, bool) {
	j := strings.LastIndex(key, "{")
	if j < 0 {
		return 0, false
	}
	n, _, ok := strings.Cut(key[j+1:], "}")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(n)
	return i, err == nil
}
