package servers_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/servers"
)

func testCerts(t *testing.T) (servers.TLSFiles, *tls.Config) {
	t.Helper()
	files, err := servers.WriteTestCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	client, err := files.ClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	return files, client
}

// TestWriteTestCertsVerifies proves the server certificate chains to the CA for the names a
// test dials, and expires within a day or so.
func TestWriteTestCertsVerifies(t *testing.T) {
	t.Parallel()
	files, client := testCerts(t)
	b, err := os.ReadFile(files.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM block", files.CertFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"127.0.0.1", "localhost"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: client.RootCAs}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: client.RootCAs}); err == nil {
		t.Error("verify for example.com: got nil error")
	}
	if life := time.Until(cert.NotAfter); life <= 0 || life > 25*time.Hour {
		t.Errorf("certificate expires in %v, want about a day", life)
	}
	if st, err := os.Stat(files.KeyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode: %v, %v; want 0600", st.Mode().Perm(), err)
	}
	if _, err := files.ServerTLS(); err != nil {
		t.Errorf("ServerTLS: %v", err)
	}
}

func redisTLSClient(addr, password string, tlsConf *tls.Config) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{addr}, Password: password, TLSConfig: tlsConf, DisableCache: true,
		Dialer: net.Dialer{Timeout: 2 * time.Second},
	})
}

// TestRedisTLSAndPassword proves the TLS port serves clients that trust the CA and give the
// password, refuses the rest, and that Restart keeps both ports.
func TestRedisTLSAndPassword(t *testing.T) {
	t.Parallel()
	files, client := testCerts(t)
	r, err := servers.StartRedis(t.TempDir(), servers.RedisOptions{Password: "s3cret", TLS: &files})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Kill() })
	if r.TLSAddr == "" || r.TLSAddr == r.Addr {
		t.Fatalf("TLSAddr %q, Addr %q: want a second address", r.TLSAddr, r.Addr)
	}

	ping := func(addr, password string, tlsConf *tls.Config) error {
		t.Helper()
		c, err := redisTLSClient(addr, password, tlsConf)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Do(ctx(t), c.B().Ping().Build()).Error()
	}
	if err := ping(r.TLSAddr, "s3cret", client); err != nil {
		t.Fatalf("PING over TLS with the password: %v", err)
	}
	if err := ping(r.TLSAddr, "", client); err == nil {
		t.Error("PING over TLS without the password: got nil error")
	}
	if err := ping(r.TLSAddr, "nope", client); err == nil {
		t.Error("PING over TLS with a wrong password: got nil error")
	}
	if err := ping(r.TLSAddr, "s3cret", &tls.Config{MinVersion: tls.VersionTLS12}); err == nil {
		t.Error("PING over TLS without trusting the test CA: got nil error")
	}
	if err := ping(r.TLSAddr, "s3cret", nil); err == nil {
		t.Error("plain PING to the TLS port: got nil error")
	}

	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	restartInPlace(t, r, &r.Addr, &r.TLSAddr)
	if err := ping(r.TLSAddr, "s3cret", client); err != nil {
		t.Errorf("PING over TLS after Restart: %v", err)
	}
}

// TestMosquittoTLSAndPassword proves an ssl:// broker delivers for clients that trust the CA and
// log in, and refuses plain TCP, anonymous and wrong-password clients and clients that do not
// trust its certificate.
func TestMosquittoTLSAndPassword(t *testing.T) {
	t.Parallel()
	files, client := testCerts(t)
	m, err := servers.StartMosquitto(t.TempDir(), servers.MosquittoOptions{Username: "sigwatch", Password: "s3cret", TLS: &files})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill() })
	if !strings.HasPrefix(m.URL, "ssl://127.0.0.1:") {
		t.Fatalf("URL: got %q, want ssl://127.0.0.1:<port>", m.URL)
	}

	if _, err := mqttConnect(t, "tcp://"+m.Addr, "plain", "sigwatch", "s3cret"); err == nil {
		t.Error("plain TCP connect to the TLS listener: got nil error")
	}
	if _, err := mqttConnectTLS(t, m.URL, "untrusting", "sigwatch", "s3cret", &tls.Config{MinVersion: tls.VersionTLS12}); err == nil {
		t.Error("TLS connect without trusting the test CA: got nil error")
	}
	if _, err := mqttConnectTLS(t, m.URL, "anon", "", "", client); err == nil {
		t.Error("anonymous TLS connect: got nil error, want refusal")
	}
	if _, err := mqttConnectTLS(t, m.URL, "wrong", "sigwatch", "nope", client); err == nil {
		t.Error("TLS connect with a wrong password: got nil error, want refusal")
	}
	mqttRoundTripTLS(t, m.URL, "sigwatch", "s3cret", "devices/d1/signal", client)

	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	restartInPlace(t, m, &m.URL)
	mqttRoundTripTLS(t, m.URL, "sigwatch", "s3cret", "devices/d2/signal", client)
}

// TestNATSTLSAndPassword proves the embedded server requires TLS and the user's password, and
// keeps requiring both after Restart.
func TestNATSTLSAndPassword(t *testing.T) {
	t.Parallel()
	files, client := testCerts(t)
	serverTLS, err := files.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	n, err := servers.StartNATS(t.TempDir(), servers.NATSOptions{JetStream: true, User: "sigwatch", Password: "s3cret", TLS: serverTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	if !strings.HasPrefix(n.URL, "tls://127.0.0.1:") {
		t.Fatalf("URL: got %q, want tls://127.0.0.1:<port>", n.URL)
	}

	connect := func(opts ...nats.Option) error {
		nc, err := nats.Connect(n.URL, append(opts, nats.NoReconnect(), nats.Timeout(5*time.Second))...)
		if err != nil {
			return err
		}
		defer nc.Close()
		return nc.Flush()
	}
	if err := connect(nats.Secure(client), nats.UserInfo("sigwatch", "s3cret")); err != nil {
		t.Fatalf("connect with TLS and the password: %v", err)
	}
	if err := connect(nats.Secure(client)); err == nil {
		t.Error("connect without credentials: got nil error")
	}
	if err := connect(nats.Secure(client), nats.UserInfo("sigwatch", "nope")); err == nil {
		t.Error("connect with a wrong password: got nil error")
	}
	// nats.go upgrades to TLS whenever the server asks for it, so "plain" can only mean a
	// client that does not trust the server's certificate.
	if err := connect(nats.UserInfo("sigwatch", "s3cret")); err == nil {
		t.Error("connect without trusting the test CA: got nil error")
	}

	restartInPlace(t, n, &n.URL)
	if err := connect(nats.Secure(client), nats.UserInfo("sigwatch", "s3cret")); err != nil {
		t.Errorf("connect after Restart: %v", err)
	}
	if err := connect(nats.Secure(client), nats.UserInfo("sigwatch", "nope")); err == nil {
		t.Error("connect with a wrong password after Restart: got nil error")
	}
}
