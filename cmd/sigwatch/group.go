package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// group runs the long-lived components of one process. They start in the
// order they are added and stop in reverse: each is cancelled and waited
// for before the one added before it, so senders stop before what they send
// to (ingest → scanner → alarm → HTTP → watchers). The first error of any
// member stops the whole group.
type group struct {
	members  []*member
	stopping chan struct{} // closed by Stop or the first failure
	stopOnce sync.Once

	errMu sync.Mutex
	err   error
}

type member struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func newGroup() *group { return &group{stopping: make(chan struct{})} }

// Go starts run as the next member. run owns everything it starts and
// returns once ctx is cancelled and it has stopped.
func (g *group) Go(name string, run func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{cancel: cancel, done: make(chan struct{})}
	g.members = append(g.members, m)
	go func() {
		defer close(m.done)
		if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			g.fail(fmt.Errorf("%s: %w", name, err))
		}
	}()
}

// fail records the first error and asks the group to stop.
func (g *group) fail(err error) {
	g.errMu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.errMu.Unlock()
	g.Stop()
}

// Stop asks the group to stop; Shutdown does it.
func (g *group) Stop() { g.stopOnce.Do(func() { close(g.stopping) }) }

// Shutdown stops the members in reverse order, each before the next, and
// returns the first error any of them failed with.
func (g *group) Shutdown() error {
	g.Stop()
	for i := len(g.members) - 1; i >= 0; i-- {
		g.members[i].cancel()
		<-g.members[i].done
	}
	g.errMu.Lock()
	defer g.errMu.Unlock()
	return g.err
}
