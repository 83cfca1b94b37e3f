package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sigwatch/sigwatch/api"
	"github.com/sigwatch/sigwatch/dispatch"
	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/shard"
	"github.com/sigwatch/sigwatch/shard/queue"
	"github.com/sigwatch/sigwatch/timer"
)

// The servers every test and example of the package runs against: a real
// redis-server, an embedded nats-server with JetStream, and sigwatch's
// timer API and engine over them.
var (
	sigwatchURL string     // the API
	natsConn    *nats.Conn // a connection to the NATS server
)

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		log.Printf("client tests: %v", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "sigwatch-client-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	r, err := servers.StartRedis(filepath.Join(dir, "redis"), servers.RedisOptions{})
	if err != nil {
		return 0, err
	}
	defer r.Kill()
	n, err := servers.StartNATS(filepath.Join(dir, "nats"), servers.NATSOptions{JetStream: true})
	if err != nil {
		return 0, err
	}
	defer n.Shutdown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store, err := shard.Dial(shard.RedisConfig{Addrs: []string{r.Addr}})
	if err != nil {
		return 0, err
	}
	defer store.Close()
	topo, err := shard.NewWatcher(ctx, store, 4, 100*time.Millisecond, nil)
	if err != nil {
		return 0, err
	}
	go topo.Run(ctx)
	if natsConn, err = nats.Connect(n.URL); err != nil {
		return 0, err
	}
	defer natsConn.Close()
	pub, err := dispatch.New(ctx, natsConn, dispatch.Options{AckWait: time.Second})
	if err != nil {
		return 0, err
	}
	svc, err := timer.New(timer.Options{Replica: "client-test", Fire: true, Config: timer.Config{NATS: true}, Consume: true,
		Engine: queue.Config{LeaseTTL: time.Second, Poll: 10 * time.Millisecond}}, store, topo, pub, nil, nil)
	if err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	srv := httptest.NewServer(api.New(api.Options{Timers: svc, Gatherer: prometheus.NewRegistry()}).Handler())
	defer srv.Close()
	sigwatchURL = srv.URL
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		return code, fmt.Errorf("timer service: %w", err)
	}
	return code, nil
}
