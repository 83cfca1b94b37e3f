//go:build demo

package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// testFreeze reads SIGWATCH_TEST_FREEZE_BEFORE_NOTIFY, a count n, or
// what:n to hold only notifications of one kind ("storm", "raised", …).
// It is a test seam only, in builds with the demo tag: the alarm worker
// holds the notifications of the transitions it has just stored until n
// are held, or a second has passed since the first, then the process stops
// itself (SIGSTOP) with them in hand; once continued it publishes them. It
// lets the process tests pause a replica exactly between a transition and
// its notification.
func testFreeze() (func(string), error) {
	v := os.Getenv("SIGWATCH_TEST_FREEZE_BEFORE_NOTIFY")
	if v == "" {
		return nil, nil
	}
	what, count, ok := strings.Cut(v, ":")
	if !ok {
		what, count = "", v
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("SIGWATCH_TEST_FREEZE_BEFORE_NOTIFY %q: want a count of at least 1, or what:count", v)
	}
	f := &freezer{what: what, n: n}
	return f.hold, nil
}

type freezer struct {
	what string // "": every kind
	n    int

	mu      sync.Mutex
	gate    chan struct{} // closed once the burst's freeze is over
	waiting int
	first   time.Time
}

func (f *freezer) hold(what string) {
	if f.what != "" && what != f.what {
		return
	}
	f.mu.Lock()
	if f.gate == nil {
		gate := make(chan struct{})
		f.gate, f.first = gate, time.Now()
		time.AfterFunc(time.Second, func() { f.freeze(gate) })
	}
	gate := f.gate
	f.waiting++
	if f.waiting >= f.n {
		go f.freeze(gate)
	}
	f.mu.Unlock()
	<-gate
}

// freeze stops the process with the burst of gate in hand, once.
func (f *freezer) freeze(gate chan struct{}) {
	f.mu.Lock()
	if f.gate != gate {
		f.mu.Unlock()
		return
	}
	n, first := f.waiting, f.first
	f.gate, f.waiting = nil, 0
	f.mu.Unlock()
	fmt.Fprintf(os.Stderr, "%s test seam: freezing with %d notifications in hand, the first held %v ago\n", time.Now().Format(time.StampMilli), n, time.Since(first).Round(time.Millisecond))
	// kill returns before every thread has stopped: the notifications go
	// out only once the process is continued.
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		fmt.Fprintf(os.Stderr, "test seam: cannot stop: %v\n", err)
	} else {
		<-cont
	}
	fmt.Fprintf(os.Stderr, "%s test seam: continued; publishing %d notifications\n", time.Now().Format(time.StampMilli), n)
	close(gate)
}
