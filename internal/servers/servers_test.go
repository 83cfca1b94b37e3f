package servers_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// These tests use the servers package directly rather than internal/testenv, which is built on
// it, so that a failure here points at the server start-up code.

func redisClient(t *testing.T, password string, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, Password: password, DisableCache: true})
	if err != nil {
		t.Fatalf("rueidis.NewClient(%v): %v", addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

// restartInPlace restarts s and fails t unless each of addrs (fields of s) holds, after the
// restart, the address it held before: a server comes back where its clients look for it.
func restartInPlace(t *testing.T, s interface{ Restart() error }, addrs ...*string) {
	t.Helper()
	want := make([]string, len(addrs))
	for i, a := range addrs {
		want[i] = *a
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	got := make([]string, len(addrs))
	for i, a := range addrs {
		got[i] = *a
	}
	if !slices.Equal(got, want) {
		t.Errorf("Restart moved the server: got %v, want %v", got, want)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestLookPathNamesTheFix(t *testing.T) {
	t.Parallel()
	_, err := servers.LookPath("sigwatch-no-such-server")
	if err == nil {
		t.Fatal("LookPath of a missing binary: got nil error")
	}
	want := "sigwatch-no-such-server not found: run `make deps` (deploy/local/install.sh)"
	if err.Error() != want {
		t.Errorf("got %q, want %q", err, want)
	}
	if !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("errors.Is(err, exec.ErrNotFound) = false for %v", err)
	}
	// mosquitto lives in /usr/sbin on Debian, often not on PATH: LookPath still finds it.
	if _, err := servers.LookPath("mosquitto"); err != nil {
		t.Errorf("LookPath(mosquitto): %v", err)
	}
}

func TestFreePortIsBindable(t *testing.T) {
	t.Parallel()
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("port %d from FreePort is not bindable: %v", port, err)
	}
	l.Close()
}

// TestRedisPersistSurvivesKill proves that with Persist, data acknowledged before a crash
// (SIGKILL) is there after Restart on the same address.
func TestRedisPersistSurvivesKill(t *testing.T) {
	t.Parallel()
	r, err := servers.StartRedis(t.TempDir(), servers.RedisOptions{Persist: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Kill() })
	addr := r.Addr

	c := redisClient(t, "", r.Addr)
	if err := c.Do(ctx(t), c.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	c.Close()

	if err := r.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("after Kill, %s still accepts connections", addr)
	}
	if err := r.Kill(); err != nil {
		t.Errorf("second Kill: got %v, want nil", err)
	}

	restartInPlace(t, r, &r.Addr)
	c = redisClient(t, "", r.Addr)
	got, err := c.Do(ctx(t), c.B().Get().Key("k").Build()).ToString()
	if err != nil || got != "v" {
		t.Fatalf("GET k after Kill+Restart: got %q, %v, want %q", got, err, "v")
	}
	if err := r.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

func TestRedisPasswordIsRequired(t *testing.T) {
	t.Parallel()
	r, err := servers.StartRedis(t.TempDir(), servers.RedisOptions{Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Kill() })

	if _, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr}, DisableCache: true}); err == nil {
		t.Error("connecting without the password: got nil error")
	}
	c := redisClient(t, r.Password, r.Addr)
	if err := c.Do(ctx(t), c.B().Ping().Build()).Error(); err != nil {
		t.Errorf("PING with password: %v", err)
	}
}

// TestRedisClusterServesEverySlot proves the cluster is usable as soon as StartRedisCluster
// returns: keys on different slots (hence different masters) can be written and read.
func TestRedisClusterServesEverySlot(t *testing.T) {
	t.Parallel()
	cl, err := servers.StartRedisCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	if len(cl.Nodes) != 3 || len(cl.Addrs) != 3 {
		t.Fatalf("got %d nodes and %d addrs, want 3 and 3", len(cl.Nodes), len(cl.Addrs))
	}

	c := redisClient(t, "", cl.Addrs...)
	if c.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode: got %s, want %s", c.Mode(), rueidis.ClientModeCluster)
	}
	for i := range 16 {
		key := fmt.Sprintf("sigwatch:{%d}:k", i)
		if err := c.Do(ctx(t), c.B().Set().Key(key).Value(key).Build()).Error(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		got, err := c.Do(ctx(t), c.B().Get().Key(key).Build()).ToString()
		if err != nil || got != key {
			t.Fatalf("GET %s: got %q, %v, want %q", key, got, err, key)
		}
	}
}

func TestRedisClusterNeedsThreeMasters(t *testing.T) {
	t.Parallel()
	if _, err := servers.StartRedisCluster(t.TempDir(), 2); err == nil {
		t.Fatal("StartRedisCluster with 2 masters: got nil error")
	}
}

func mqttConnect(t *testing.T, url, id, user, password string) (mqtt.Client, error) {
	t.Helper()
	return mqttConnectTLS(t, url, id, user, password, nil)
}

// mqttConnectTLS connects once, without retries, using tlsConf for ssl:// URLs.
func mqttConnectTLS(t *testing.T, url, id, user, password string, tlsConf *tls.Config) (mqtt.Client, error) {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID(id).
		SetUsername(user).SetPassword(password).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(5 * time.Second)
	if tlsConf != nil {
		o.SetTLSConfig(tlsConf)
	}
	c := mqtt.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(5 * time.Second) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c, nil
}

// mqttRoundTrip subscribes with one client, publishes at QoS 1 with another and waits for the
// message.
func mqttRoundTrip(t *testing.T, url, user, password, topic string) {
	t.Helper()
	mqttRoundTripTLS(t, url, user, password, topic, nil)
}

// mqttRoundTripTLS is mqttRoundTrip with tlsConf for ssl:// URLs.
func mqttRoundTripTLS(t *testing.T, url, user, password, topic string, tlsConf *tls.Config) {
	t.Helper()
	got := make(chan string, 1)
	sub, err := mqttConnectTLS(t, url, "sub-"+t.Name(), user, password, tlsConf)
	if err != nil {
		t.Fatalf("subscriber connect to %s: %v", url, err)
	}
	tok := sub.Subscribe("devices/+/signal", 1, func(_ mqtt.Client, m mqtt.Message) {
		select {
		case got <- m.Topic() + " " + string(m.Payload()):
		default:
		}
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	pub, err := mqttConnectTLS(t, url, "pub-"+t.Name(), user, password, tlsConf)
	if err != nil {
		t.Fatalf("publisher connect to %s: %v", url, err)
	}
	tok = pub.Publish(topic, 1, false, "hello")
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	want := topic + " hello"
	select {
	case m := <-got:
		if m != want {
			t.Fatalf("got %q, want %q", m, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no message on %s within 5s", topic)
	}
	sub.Disconnect(0)
	pub.Disconnect(0)
}

// TestMosquittoRestartKeepsAddress proves a broker that crashed comes back on the same URL.
func TestMosquittoRestartKeepsAddress(t *testing.T) {
	t.Parallel()
	m, err := servers.StartMosquitto(t.TempDir(), servers.MosquittoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill() })
	if !strings.HasPrefix(m.URL, "tcp://127.0.0.1:") {
		t.Errorf("URL: got %q, want tcp://127.0.0.1:<port>", m.URL)
	}
	mqttRoundTrip(t, m.URL, "", "", "devices/d1/signal")

	if err := m.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	restartInPlace(t, m, &m.URL)
	mqttRoundTrip(t, m.URL, "", "", "devices/d2/signal")
	if err := m.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

func TestMosquittoPasswordIsRequired(t *testing.T) {
	t.Parallel()
	m, err := servers.StartMosquitto(t.TempDir(), servers.MosquittoOptions{Username: "sigwatch", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill() })
	if _, err := mqttConnect(t, m.URL, "anon", "", ""); err == nil {
		t.Error("anonymous connect: got nil error, want refusal")
	}
	if _, err := mqttConnect(t, m.URL, "wrong", "sigwatch", "nope"); err == nil {
		t.Error("connect with a wrong password: got nil error, want refusal")
	}
	mqttRoundTrip(t, m.URL, "sigwatch", "s3cret", "devices/d1/signal")
}

// TestNATSJetStreamSurvivesRestart proves a stream and its messages outlive a restart on the same
// URL, and that the MQTT listener feeds NATS subjects.
func TestNATSJetStreamSurvivesRestart(t *testing.T) {
	t.Parallel()
	n, err := servers.StartNATS(t.TempDir(), servers.NATSOptions{JetStream: true, MQTT: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)

	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatalf("connect %s: %v", n.URL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx(t), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(ctx(t), "t.x", []byte("1")); err != nil {
		t.Fatalf("publish: %v", err)
	}

	// MQTT devices/d1/signal is NATS subject devices.d1.signal.
	sub, err := nc.SubscribeSync("devices.*.signal")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	pub, err := mqttConnect(t, n.MQTTURL, "pub", "", "")
	if err != nil {
		t.Fatalf("MQTT connect to %s: %v", n.MQTTURL, err)
	}
	if tok := pub.Publish("devices/d1/signal", 1, false, "hi"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("MQTT publish: %v", tok.Error())
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("NATS did not get the MQTT message: %v", err)
	}
	if msg.Subject != "devices.d1.signal" || string(msg.Data) != "hi" {
		t.Errorf("got %s %q, want devices.d1.signal \"hi\"", msg.Subject, msg.Data)
	}
	pub.Disconnect(0)
	nc.Close()

	restartInPlace(t, n, &n.URL, &n.MQTTURL)
	nc, err = nats.Connect(n.URL)
	if err != nil {
		t.Fatalf("connect after Restart: %v", err)
	}
	defer nc.Close()
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx(t), "T")
	if err != nil {
		t.Fatalf("stream T after Restart: %v", err)
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("messages in T after Restart: got %d, want 1", info.State.Msgs)
	}
}
