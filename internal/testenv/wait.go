package testenv

import (
	"testing"
	"time"
)

// poll is how often WaitFor and Never ask their condition.
const poll = 10 * time.Millisecond

// WaitFor polls cond every 10ms until it returns true, and fails the test if that takes longer
// than timeout. what completes the sentence "timed out waiting for ...". It must be called from
// the test's goroutine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
			return
		}
		<-tick.C
	}
}

// Never polls cond every 10ms for d, and fails the test as soon as it returns true: it is the
// check that something does not happen, in place of sleeping and looking once. what completes
// the sentence "... after 120ms of 2s, want never". It must be called from the test's goroutine.
func Never(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		if cond() {
			t.Fatalf("%s after %v of %v, want never", what, time.Since(start).Round(time.Millisecond), d)
			return
		}
		if time.Now().After(deadline) {
			return
		}
		<-tick.C
	}
}
