//go:build demo

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// The standard ports, which `sigwatch dev` takes where they are free so that
// mosquitto_pub and the CLI work without flags.
const (
	stdMQTTPort  = 1883
	stdNATSPort  = 4222
	stdRedisPort = 6379
	stdHTTPPort  = 8080
)

// localServers are the Redis, NATS (JetStream) and MQTT broker that the
// demo and `sigwatch dev` start, each in a directory of its own under dir.
type localServers struct {
	redis      *servers.Redis
	nats       *servers.NATS
	mosquitto  *servers.Mosquitto // nil when the broker is the NATS MQTT listener
	brokerURL  string             // tcp://host:port
	brokerName string             // "mosquitto" or "nats-server MQTT listener"
}

// startLocalServers starts the three servers. With standard, each takes
// its standard port when that is free, and a free one otherwise; without,
// free ones. broker is mosquitto, nats (nats-server's MQTT listener) or
// auto (mosquitto if installed).
func startLocalServers(dir, broker string, standard bool) (*localServers, error) {
	s := &localServers{}
	ok := false
	defer func() {
		if !ok {
			s.stop()
		}
	}()
	useMosquitto := broker == "mosquitto"
	if broker == "auto" {
		_, err := servers.LookPath("mosquitto")
		useMosquitto = err == nil
	}
	var err error
	if s.redis, err = onPort(stdRedisPort, standard, func(port int) (*servers.Redis, error) {
		return servers.StartRedis(filepath.Join(dir, "redis"), servers.RedisOptions{Port: port})
	}); err != nil {
		return nil, err
	}
	if s.nats, err = onPort(stdNATSPort, standard, func(port int) (*servers.NATS, error) {
		return servers.StartNATS(filepath.Join(dir, "nats"), servers.NATSOptions{JetStream: true, MQTT: !useMosquitto, Port: port})
	}); err != nil {
		return nil, err
	}
	s.brokerURL, s.brokerName = s.nats.MQTTURL, "nats-server MQTT listener"
	if useMosquitto {
		if s.mosquitto, err = onPort(stdMQTTPort, standard, func(port int) (*servers.Mosquitto, error) {
			return servers.StartMosquitto(filepath.Join(dir, "mosquitto"), servers.MosquittoOptions{Port: port})
		}); err != nil {
			return nil, err
		}
		s.brokerURL, s.brokerName = s.mosquitto.URL, "mosquitto"
	}
	ok = true
	return s, nil
}

// stop stops whichever servers are running, the broker first.
func (s *localServers) stop() {
	if s.mosquitto != nil {
		_ = s.mosquitto.Stop()
	}
	if s.nats != nil {
		s.nats.Shutdown()
	}
	if s.redis != nil {
		_ = s.redis.Stop()
	}
}

// onPort starts a server on std when standard is asked for and std is
// free, else (or when that start fails) on a free port (0).
func onPort[T any](std int, standard bool, start func(port int) (T, error)) (T, error) {
	if standard && portFree(std) {
		if v, err := start(std); err == nil {
			return v, nil
		}
	}
	return start(0)
}

// portFree says whether port can be bound on 127.0.0.1 now (a server on
// any address of the host holding it counts as taken).
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	return l.Close() == nil
}

// portOf is the port of a URL or host:port ("" if it has none).
func portOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return ""
}

// waitSubscribed waits until app's ingest has subscribed at the broker, so
// that a device published once the addresses are printed is not missed.
func waitSubscribed(ctx context.Context, app *App) error {
	deadline := time.Now().Add(30 * time.Second)
	for app.in != nil && !app.in.Connected() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not subscribed at the MQTT broker %s after 30s", strings.Join(app.cfg.MQTT.Brokers, ","))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// workDir is dir, created if needed, or a new directory named after
// pattern under the system's temp directory; absolute either way.
func workDir(dir, pattern string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", pattern)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return filepath.Abs(dir)
}
