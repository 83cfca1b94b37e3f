package testenv

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// CheckNoLeak fails t unless, within the given time, no goroutine but the
// caller's has a stack that mentions one of funcs (e.g.
// "sigwatch/shard/queue."). Call it once everything the test started has
// been told to stop.
func CheckNoLeak(t testing.TB, within time.Duration, funcs ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "testenv.CheckNoLeak") {
				continue // the caller's own goroutine
			}
			for _, f := range funcs {
				if strings.Contains(g, f) {
					leaked = append(leaked, g)
					break
				}
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d goroutines of %v still running, want 0:\n%s", len(leaked), funcs, strings.Join(leaked, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
