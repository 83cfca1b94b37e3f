package testenv

import (
	"crypto/tls"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sigwatch/sigwatch/internal/servers"
	"github.com/sigwatch/sigwatch/shard"
)

// Options says which servers besides Redis a test needs.
type Options struct {
	Mosquitto bool // a Mosquitto broker, tuned as deploy/local/mosquitto.conf
	NATS      bool // an embedded nats-server with JetStream
	NATSMQTT  bool // the same, with its MQTT listener enabled (implies NATS)
	// NATSSystem adds a system account with one user (Env.NATSSystem), who sees the server's
	// advisories; every other client keeps working as without it.
	NATSSystem bool
	// RedisPersist turns on Redis's append-only file, for tests that Kill and Restart Redis and
	// expect the data back.
	RedisPersist bool
	// RedisArgs are added to redis-server's command line, e.g. "--appendfsync", "always".
	RedisArgs []string
	// Secure makes every server asked for require TLS, with certificates of a throwaway CA
	// (Env.Certs, Env.ClientTLS), and these credentials (Redis takes only the password, on
	// Redis.TLSAddr).
	Secure *Credentials
}

// Credentials are a user name and password.
type Credentials struct {
	User, Password string
}

// Env is a test's set of running servers. Fields for servers not asked for are nil.
type Env struct {
	Redis     *servers.Redis
	Mosquitto *servers.Mosquitto
	NATS      *servers.NATS
	// NATSSystem is the system account's user, with Options.NATSSystem.
	NATSSystem *Credentials

	// With Options.Secure: the credentials the servers require, the files their certificates
	// were made from, and a client configuration that trusts only their CA.
	Secure    *Credentials
	Certs     servers.TLSFiles
	ClientTLS *tls.Config
}

// New starts the servers opts asks for, and Redis. They are killed when the test ends; when the
// test failed, the end of each server's log is written to the test log first.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	dir := t.TempDir()
	env := &Env{}
	ropts := servers.RedisOptions{Persist: opts.RedisPersist, ExtraArgs: opts.RedisArgs}
	var mopts servers.MosquittoOptions
	nopts := servers.NATSOptions{JetStream: true, MQTT: opts.NATSMQTT}
	if sec := opts.Secure; sec != nil {
		env.Secure = sec
		serverTLS := env.makeCerts(t, filepath.Join(dir, "certs"))
		ropts.Password, ropts.TLS = sec.Password, &env.Certs
		mopts = servers.MosquittoOptions{Username: sec.User, Password: sec.Password, TLS: &env.Certs}
		nopts.User, nopts.Password, nopts.TLS = sec.User, sec.Password, serverTLS
	}
	if opts.NATSSystem {
		env.NATSSystem = &Credentials{User: "sys", Password: "sys"}
		nopts.SystemUser, nopts.SystemPassword = env.NATSSystem.User, env.NATSSystem.Password
	}

	r, err := servers.StartRedis(filepath.Join(dir, "redis"), ropts)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	env.Redis = r
	stopWhenDone(t, "redis", r.LogPath(), r.Kill)

	if opts.Mosquitto {
		m, err := servers.StartMosquitto(filepath.Join(dir, "mosquitto"), mopts)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		env.Mosquitto = m
		stopWhenDone(t, "mosquitto", m.LogPath(), m.Kill)
	}

	if opts.NATS || opts.NATSMQTT {
		n, err := servers.StartNATS(filepath.Join(dir, "nats"), nopts)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		env.NATS = n
		stopWhenDone(t, "nats", n.LogPath(), func() error { n.Shutdown(); return nil })
	}
	return env
}

// makeCerts writes a throwaway CA and server certificate into dir, keeps the files and a client
// configuration in env, and returns the servers' configuration.
func (env *Env) makeCerts(t testing.TB, dir string) *tls.Config {
	t.Helper()
	certs, err := servers.WriteTestCerts(dir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	env.Certs = certs
	if env.ClientTLS, err = certs.ClientTLS(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	serverTLS, err := certs.ServerTLS()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return serverTLS
}

// RedisCluster starts a Redis Cluster of masters nodes (at least 3) without replicas, stopped
// when the test ends.
func RedisCluster(t testing.TB, masters int) *servers.RedisCluster {
	t.Helper()
	c, err := servers.StartRedisCluster(t.TempDir(), masters)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	stopClusterWhenDone(t, c)
	return c
}

// stopWhenDone stops a server with stop when the test ends, after writing the end of its log to
// the test log if the test failed.
func stopWhenDone(t testing.TB, name, logPath string, stop func() error) {
	t.Cleanup(func() {
		logOnFailure(t, name, logPath)
		if err := stop(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
}

// logOnFailure writes the end of a server's log to the test log if the test failed, since the
// log itself is removed with the test's temporary directory.
func logOnFailure(t testing.TB, name, path string) {
	if !t.Failed() {
		return
	}
	t.Logf("testenv: end of %s log %s:\n%s", name, path, servers.LogTail(path))
}

// Store returns a shard store on env's Redis whose keys start with prefix, on a Redis client of
// its own that is closed when the test ends.
func (env *Env) Store(t testing.TB, prefix string) *shard.Store {
	t.Helper()
	return storeOn(t, []string{env.Redis.Addr}, env.Redis.Password, prefix)
}

// StoreOn is Env.Store on the Redis at addrs: a Redis Cluster's nodes, say.
func StoreOn(t testing.TB, addrs []string, prefix string) *shard.Store {
	t.Helper()
	return storeOn(t, addrs, "", prefix)
}

// SingleAndCluster returns, under the names "single" and "cluster", a store on a fresh Redis and
// one on a fresh three-master Redis Cluster, for a test that must hold on both.
func SingleAndCluster(t testing.TB, prefix string) map[string]*shard.Store {
	t.Helper()
	env := New(t, Options{})
	cluster := RedisCluster(t, 3)
	return map[string]*shard.Store{
		"single":  env.Store(t, prefix),
		"cluster": StoreOn(t, cluster.Addrs, prefix),
	}
}

func storeOn(t testing.TB, addrs []string, password, prefix string) *shard.Store {
	t.Helper()
	s, err := shard.Dial(shard.RedisConfig{Addrs: addrs, Password: password, Prefix: prefix})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Conn returns a connection to env's NATS with opts, closed when the test ends. The test must
// have asked for NATS.
func (env *Env) Conn(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	if env.NATS == nil {
		t.Fatalf("testenv: Conn without NATS: set Options.NATS")
	}
	if env.Secure != nil {
		opts = append([]nats.Option{nats.Secure(env.ClientTLS), nats.UserInfo(env.Secure.User, env.Secure.Password)}, opts...)
	}
	nc, err := nats.Connect(env.NATS.URL, opts...)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", env.NATS.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
