package testenv_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/testenv"
)

func dial(t *testing.T, what, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("%s at %s: %v", what, addr, err)
	}
	c.Close()
}

// TestNewStartsWhatIsAskedFor proves one call gives a Redis, a Mosquitto and a NATS with
// JetStream and MQTT, each answering on its address.
func TestNewStartsWhatIsAskedFor(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATSMQTT: true, RedisPersist: true})
	if env.Redis == nil || env.Mosquitto == nil || env.NATS == nil {
		t.Fatalf("got Redis %v, Mosquitto %v, NATS %v; want all three", env.Redis, env.Mosquitto, env.NATS)
	}

	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{env.Redis.Addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("redis: %v", err)
	}
	defer c.Close()
	if err := c.Do(context.Background(), c.B().Ping().Build()).Error(); err != nil {
		t.Errorf("redis PING: %v", err)
	}

	dial(t, "mosquitto", env.Mosquitto.Addr)
	dial(t, "nats MQTT listener", env.NATS.MQTTAddr)

	nc, err := nats.Connect(env.NATS.URL)
	if err != nil {
		t.Fatalf("nats: %v", err)
	}
	defer nc.Close()
	if _, err := nc.JetStream(); err != nil {
		t.Errorf("jetstream: %v", err)
	}
	if _, err := nc.RTT(); err != nil {
		t.Errorf("nats RTT: %v", err)
	}
}

func TestNewRedisOnly(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	if env.Redis == nil || env.Mosquitto != nil || env.NATS != nil {
		t.Fatalf("got Redis %v, Mosquitto %v, NATS %v; want Redis only", env.Redis, env.Mosquitto, env.NATS)
	}
	dial(t, "redis", env.Redis.Addr)
}

func TestWaitForReturnsOnceTrue(t *testing.T) {
	var n atomic.Int32
	testenv.WaitFor(t, 5*time.Second, "the third poll", func() bool { return n.Add(1) >= 3 })
	if got := n.Load(); got != 3 {
		t.Errorf("cond called %d times, want 3", got)
	}
}

// fakeT is a testing.TB whose Fatalf and Errorf record the message instead of ending or failing
// the test.
type fakeT struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (r *fakeT) Helper() {}
func (r *fakeT) Fatalf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msg = fmt.Sprintf(format, args...)
}
func (r *fakeT) Errorf(format string, args ...any) { r.Fatalf(format, args...) }
func (r *fakeT) message() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.msg
}

func TestWaitForFailsWithWhatItWaitedFor(t *testing.T) {
	r := &fakeT{TB: t}
	start := time.Now()
	testenv.WaitFor(r, 50*time.Millisecond, "Godot", func() bool { return false })
	if want := "timed out after 50ms waiting for Godot"; r.message() != want {
		t.Errorf("got %q, want %q", r.message(), want)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("WaitFor gave up after %v, before its 50ms timeout", d)
	}
}

func TestRedisClusterHasEveryMaster(t *testing.T) {
	c := testenv.RedisCluster(t, 3)
	if len(c.Addrs) != 3 {
		t.Fatalf("got %d addrs, want 3", len(c.Addrs))
	}
	for _, a := range c.Addrs {
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("node address %q is not on 127.0.0.1", a)
		}
	}
}
