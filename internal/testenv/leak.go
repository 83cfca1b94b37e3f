package testenv

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// background lists the code whose goroutines a test's servers and shared clients keep running
// on purpose: the embedded nats-server (its connections, JetStream consumers and timers), NATS
// and Redis clients the test owns and closes after the check, and the waiters of the server
// processes. A goroutine with a frame whose function name starts with one of these is not a
// leak. A stack names a function by its package path with the dots of the last element escaped
// (nats.go's functions are "github.com/nats-io/nats%2ego.(*Conn)...."), so both spellings are
// listed.
var background = []string{
	"github.com/nats-io/nats-server/",
	"github.com/nats-io/nats.go",
	"github.com/nats-io/nats%2ego",
	"github.com/redis/rueidis",
	"github.com/sigwatch/sigwatch/internal/servers.",
	"os/exec.",
}

// LeakOption changes what VerifyNone counts as a leak.
type LeakOption func(*leakCheck)

type leakCheck struct {
	prefixes []string
	opts     []goleak.Option
	timeout  time.Duration
}

// IgnoreCurrent leaves out the goroutines running now. Take it before starting the code under
// test and pass it to VerifyNone after stopping it.
func IgnoreCurrent() LeakOption {
	o := goleak.IgnoreCurrent()
	return func(c *leakCheck) { c.opts = append(c.opts, o) }
}

// IgnoreFuncs leaves out every goroutine with a frame whose function name starts with one of
// prefixes: a package path ("github.com/eclipse/paho.mqtt.golang"), a type's methods
// ("github.com/sigwatch/sigwatch/scanner.(*harness)") or one function.
func IgnoreFuncs(prefixes ...string) LeakOption {
	return func(c *leakCheck) { c.prefixes = append(c.prefixes, prefixes...) }
}

// LeakTimeout is how long VerifyNone waits for goroutines to end; 5s unless set.
func LeakTimeout(d time.Duration) LeakOption {
	return func(c *leakCheck) { c.timeout = d }
}

// VerifyNone fails the test if, within the leak timeout, goroutines are still running that are
// neither the testing package's nor the runtime's (goleak's rules), nor the background of the
// test's servers and clients, nor left out by opts. Call it once the code under test has
// stopped; it is not for parallel tests, whose goroutines it would see.
func VerifyNone(t testing.TB, opts ...LeakOption) {
	t.Helper()
	c := newLeakCheck(opts)
	deadline := time.Now().Add(c.timeout)
	for {
		err := c.find()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines still running %v after the code under test stopped: %v", c.timeout, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Leaks looks once, without waiting, for the goroutines VerifyNone would report, and returns
// them as an error, or nil. A test uses it to show the check sees the code under test while it
// runs.
func Leaks(opts ...LeakOption) error {
	c := newLeakCheck(opts)
	return c.find()
}

func newLeakCheck(opts []LeakOption) *leakCheck {
	c := &leakCheck{prefixes: slices.Clone(background), timeout: 5 * time.Second}
	for _, o := range opts {
		o(c)
	}
	return c
}

func (c *leakCheck) find() error {
	// goleak matches function names exactly: name those running now under the prefixes.
	gopts := slices.Clone(c.opts)
	for _, f := range runningFuncs(c.prefixes) {
		gopts = append(gopts, goleak.IgnoreAnyFunction(f))
	}
	return goleak.Find(gopts...)
}

// runningFuncs returns the names of the functions on any goroutine's stack that start with one
// of prefixes.
func runningFuncs(prefixes []string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(string(buf), "\n") {
		if line == "" || line[0] == '\t' || strings.HasPrefix(line, "goroutine ") || strings.HasPrefix(line, "created by ") {
			continue
		}
		// A frame line is "pkg.Func(args)"; the arguments are the last parenthesis.
		name := line
		if i := strings.LastIndexByte(line, '('); i > 0 {
			name = line[:i]
		}
		if seen[name] {
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				seen[name] = true
				out = append(out, name)
				break
			}
		}
	}
	return out
}
