package shard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/shard"
)

// TestCallsReturnByTheirDeadlineWhileRedisHangs: with Redis hung (SIGSTOP)
// the client reconnects, and a call with a short deadline returns by it even
// while another caller, with a long deadline or none, holds the dial (which
// rueidis makes every caller wait for: 4.5s past a 500ms deadline before).
func TestCallsReturnByTheirDeadlineWhileRedisHangs(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	s := env.Store(t, "bounded")
	const deadline = 300 * time.Millisecond
	const margin = 500 * time.Millisecond // scheduling on a loaded machine, against the seconds a reconnect holds a caller

	// The client's connections are cut, then Redis hangs: every caller
	// now waits for a reconnect, whose handshake cannot finish.
	kill := context.Background()
	if err := s.Ping(kill); err != nil {
		t.Fatal(err)
	}
	if err := s.Do(kill, "CLIENT", nil, "KILL", "TYPE", "normal").Error(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := env.Redis.Pause(); err != nil {
		t.Fatal(err)
	}
	resume := sync.OnceFunc(func() {
		if err := env.Redis.Resume(); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(resume)

	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var worst time.Duration
	calls := 0
	// Callers that hold dials for long: no deadline, and one of 30s.
	for _, d := range []time.Duration{0, 30 * time.Second} {
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, cancel := context.WithCancel(context.Background())
				if d > 0 {
					cctx, cancel = context.WithTimeout(context.Background(), d)
				}
				_ = s.Ping(cctx)
				cancel()
			}
		})
	}
	for range 6 {
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				cctx, cancel := context.WithTimeout(context.Background(), deadline)
				_ = s.Ping(cctx)
				_ = s.DoMulti(cctx, shard.Cmd{Name: "PING"}, shard.Cmd{Name: "PING"})
				cancel()
				took := time.Since(start)
				mu.Lock()
				worst = max(worst, took)
				calls++
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	time.Sleep(7 * time.Second) // past one dial timeout (5s)
	resume()
	time.Sleep(500 * time.Millisecond)
	stop()
	wg.Wait()
	t.Logf("%d calls with a %s deadline; the longest took %s; the longest overrun of any call: %s", calls, deadline, worst, s.LongestOverrun())
	if worst > deadline+margin {
		t.Errorf("a call with a %s deadline took %s with Redis hung, want at most %s", deadline, worst, deadline+margin)
	}
	if o := s.LongestOverrun(); o > margin {
		t.Errorf("a call returned %s past its deadline, want at most %s", o, margin)
	}
}
