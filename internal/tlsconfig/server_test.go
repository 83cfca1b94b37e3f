package tlsconfig_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/internal/testenv"
	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// serve accepts TLS connections with cfg until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	tl := tls.NewListener(ln, cfg)
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = c.Write([]byte("ok"))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// dial handshakes and reads a byte, so that a refused client certificate
// (TLS 1.3 refuses it after the client's side is done) shows as an error.
func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func servedSerial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c, err := dial(addr, cfg)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func replace(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// TestServerReloadsAReplacedPair replaces the certificate on disk: it is
// served within the poll; a pair written half-way keeps the old one, with
// a warning, until the key follows; Reload reads the files at once.
func TestServerReloadsAReplacedPair(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "ca")
	first := ca.Server("first", time.Hour)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	replace(t, first.CertFile, certFile)
	replace(t, first.KeyFile, keyFile)
	logs := &testenv.LogBuffer{}
	s, err := tlsconfig.NewServer(certFile, keyFile, "", slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go s.Watch(ctx, 50*time.Millisecond)
	addr := serve(t, s.Config())
	client := &tls.Config{RootCAs: ca.Pool()}
	if got := servedSerial(t, addr, client); got != first.Cert.SerialNumber.String() {
		t.Fatalf("serves %s, want the first certificate %s", got, first.Cert.SerialNumber)
	}

	second := ca.Server("second", 2*time.Hour)
	replace(t, second.CertFile, certFile) // the key is still the first's
	testenv.WaitFor(t, 5*time.Second, "a warning about the half-written pair", func() bool {
		return strings.Contains(logs.String(), "kept the certificate in use")
	})
	if got := servedSerial(t, addr, client); got != first.Cert.SerialNumber.String() {
		t.Fatalf("a half-written pair: serves %s, want the first certificate still", got)
	}
	replace(t, second.KeyFile, keyFile)
	testenv.WaitFor(t, 5*time.Second, "the second certificate served", func() bool {
		return servedSerial(t, addr, client) == second.Cert.SerialNumber.String()
	})

	// Reload reads at once, whatever the poll.
	cancel()
	third := ca.Server("third", 3*time.Hour)
	replace(t, third.CertFile, certFile)
	replace(t, third.KeyFile, keyFile)
	s.Reload()
	if got := servedSerial(t, addr, client); got != third.Cert.SerialNumber.String() {
		t.Fatalf("after Reload: serves %s, want the third certificate %s", got, third.Cert.SerialNumber)
	}
}

// TestServerMutualTLS refuses a client without a certificate or with one
// of another CA, and follows a replaced client CA file.
func TestServerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "ca")
	srv := ca.Server("server", time.Hour)
	clients := testenv.NewCA(t, dir, "clients")
	caFile := filepath.Join(dir, "client-ca.pem")
	replace(t, clients.File, caFile)
	s, err := tlsconfig.NewServer(srv.CertFile, srv.KeyFile, caFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s.Config())
	withCert := func(is testenv.Issued) *tls.Config {
		c, err := tls.LoadX509KeyPair(is.CertFile, is.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{c}}
	}
	if _, err := dial(addr, &tls.Config{RootCAs: ca.Pool()}); err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("a client without a certificate: %v, want refused (certificate required)", err)
	}
	c, err := dial(addr, withCert(clients.Client("alice")))
	if err != nil {
		t.Fatalf("a client with a certificate of the client CA: %v", err)
	}
	c.Close()
	other := testenv.NewCA(t, dir, "other")
	if _, err := dial(addr, withCert(other.Client("mallory"))); err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}

	// The client CA file now names the other CA: its clients get in, the
	// first CA's no longer.
	replace(t, other.File, caFile)
	s.Reload()
	if c, err := dial(addr, withCert(other.Client("bob"))); err != nil {
		t.Fatalf("after the client CA changed: %v", err)
	} else {
		c.Close()
	}
	if _, err := dial(addr, withCert(clients.Client("carol"))); err == nil {
		t.Fatal("a client of the replaced CA was still accepted")
	}
}

// TestServerErrorsNameTheFile checks the start-up errors are one line that
// says which file is wrong and how.
func TestServerErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "ca")
	a, b := ca.Server("a", time.Hour), ca.Server("b", time.Hour)
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct{ cert, key, ca, want string }{
		{missing, a.KeyFile, "", "cert_file " + missing + ": no such file or directory"},
		{a.CertFile, missing, "", "key_file " + missing + ": no such file or directory"},
		{a.CertFile, b.KeyFile, "", "are not a certificate and its key (PEM): private key does not match public key"},
		{junk, a.KeyFile, "", "cert_file " + junk + " and key_file " + a.KeyFile + " are not a certificate and its key"},
		{a.CertFile, a.KeyFile, junk, "client_ca_file " + junk + ": no PEM certificate in it"},
	} {
		_, err := tlsconfig.NewServer(c.cert, c.key, c.ca, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("NewServer(%s, %s, %q): %v, want one line with %q", filepath.Base(c.cert), filepath.Base(c.key), c.ca, err, c.want)
		}
	}
}
