package main

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sigwatch/sigwatch/client"
	"github.com/sigwatch/sigwatch/internal/testenv"
)

// These tests serve the API over HTTPS from a real process, with a CA each
// test makes, and reach it as operators do: the CLI, the Go client and a
// plain TLS handshake.

// tlsPair copies an issued certificate and key to the two paths sigwatch
// is configured with, each by a rename, as a secret mount is updated.
func tlsPair(t *testing.T, is testenv.Issued, certFile, keyFile string) {
	t.Helper()
	for _, c := range [][2]string{{is.CertFile, certFile}, {is.KeyFile, keyFile}} {
		b, err := os.ReadFile(c[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c[1]+".tmp", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(c[1]+".tmp", c[1]); err != nil {
			t.Fatal(err)
		}
	}
}

// servedSerial is the serial of the certificate addr shows; "" when the
// handshake fails.
func servedSerial(addr string, cfg *tls.Config) string {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return ""
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func httpsClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// waitHTTPS waits for the process to answer /healthz over HTTPS.
func waitHTTPS(t *testing.T, addr string, cfg *tls.Config) {
	t.Helper()
	hc := httpsClient(cfg)
	testenv.WaitFor(t, 20*time.Second, "the API over HTTPS", func() bool {
		resp, err := hc.Get("https://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// sigwatchCLI runs a CLI verb and returns its combined output.
func sigwatchCLI(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHTTPSEndToEnd serves the API over HTTPS: the CLI with --ca and the Go
// client reach it, a CLI without the CA or with http:// gets one plain
// line, every answer carries HSTS, and a certificate replaced on disk is
// served without a restart: by the poll, and by SIGHUP alone when the
// files look unchanged.
func TestHTTPSEndToEnd(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "ca")
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := ca.Server("first", 24*time.Hour)
	tlsPair(t, first, certFile, keyFile)
	addr := freeAddr(t)
	p := startProc(t, env, "https", "SIGWATCH_HTTP_ADDR="+addr,
		"SIGWATCH_HTTP_TLS_CERT_FILE="+certFile, "SIGWATCH_HTTP_TLS_KEY_FILE="+keyFile)
	trust := &tls.Config{RootCAs: ca.Pool()}
	waitHTTPS(t, addr, trust)
	base := "https://" + addr

	// HSTS on every answer, and HTTP/2 offered.
	resp, err := httpsClient(trust).Post(base+"/v1/signals", "application/json", strings.NewReader(`[{"device":"tls-1","type":"meter"}]`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 || resp.Header.Get("Strict-Transport-Security") != "max-age=31536000" {
		t.Fatalf("POST /v1/signals over HTTPS: %s, Strict-Transport-Security %q", resp.Status, resp.Header.Get("Strict-Transport-Security"))
	}

	// The CLI, with the CA and without.
	out, err := sigwatchCLI(t, nil, "device", "ls", "--api", base, "--ca", ca.File)
	if err != nil || !strings.Contains(out, "tls-1") {
		t.Fatalf("sigwatch device ls --ca: %v\n%s", err, out)
	}
	out, err = sigwatchCLI(t, []string{"SIGWATCH_API=" + base, "SIGWATCH_API_CA=" + ca.File}, "device", "get", "tls-1")
	if err != nil || !strings.Contains(out, "tls-1") {
		t.Fatalf("sigwatch device get with SIGWATCH_API_CA: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"device", "ls", "--api", base}, "sigwatch: the API at " + base + " shows a certificate not signed by a CA this host trusts: give its CA with --ca FILE (SIGWATCH_API_CA)\n"},
		{[]string{"device", "ls", "--api", "http://" + addr}, "sigwatch: the API at http://" + addr + " serves HTTPS: use https:// in --api"},
		{[]string{"device", "ls", "--api", base, "--ca", filepath.Join(dir, "nope.pem")}, "sigwatch: --ca " + filepath.Join(dir, "nope.pem") + ": no such file or directory\n"},
		{[]string{"device", "ls", "--api", base, "--ca", keyFile}, "sigwatch: --ca " + keyFile + ": no PEM certificate in it\n"},
	} {
		out, err := sigwatchCLI(t, nil, c.args...)
		if err == nil || !strings.HasPrefix(out, c.want) || strings.Count(out, "\n") != 1 {
			t.Errorf("sigwatch %s: %v, output %q, want one line starting %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}

	// healthcheck, as a container's health check runs it.
	if out, err := sigwatchCLI(t, []string{"SIGWATCH_API_CA=" + ca.File}, "healthcheck", base+"/healthz"); err != nil {
		t.Errorf("sigwatch healthcheck over HTTPS with SIGWATCH_API_CA: %v\n%s", err, out)
	}
	if out, err := sigwatchCLI(t, nil, "healthcheck", base+"/healthz"); err == nil || !strings.Contains(out, "not signed by a CA this host trusts") {
		t.Errorf("sigwatch healthcheck over HTTPS without the CA: %v\n%s", err, out)
	}

	// The Go client, given an *http.Client that trusts the CA.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	gc, err := client.New(client.Options{URL: base, HTTPClient: httpsClient(trust)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gc.Reset(ctx, "orders", "o-1", time.Hour, map[string]int{"customer": 42}); err != nil {
		t.Fatalf("client Reset over HTTPS: %v", err)
	}
	if tm, ok, err := gc.Get(ctx, "orders", "o-1"); err != nil || !ok || tm.ID != "o-1" {
		t.Fatalf("client Get over HTTPS: %+v %v %v", tm, ok, err)
	}
	untrusting, _ := client.New(client.Options{URL: base})
	if _, _, err := untrusting.Get(ctx, "orders", "o-1"); err == nil {
		t.Fatal("a client that does not trust the CA got an answer")
	}

	// A renewed certificate replaced on disk: served within the poll.
	if got := servedSerial(addr, trust); got != first.Cert.SerialNumber.String() {
		t.Fatalf("serves %s, want the first certificate %s", got, first.Cert.SerialNumber)
	}
	second := ca.Server("second", 48*time.Hour)
	tlsPair(t, second, certFile, keyFile)
	replaced := time.Now()
	testenv.WaitFor(t, 5*time.Second, "the renewed certificate served", func() bool {
		return servedSerial(addr, trust) == second.Cert.SerialNumber.String()
	})
	t.Logf("the renewed certificate was served %v after it was replaced", time.Since(replaced).Round(10*time.Millisecond))
	if out, err := sigwatchCLI(t, nil, "device", "get", "tls-1", "--api", base, "--ca", ca.File); err != nil {
		t.Fatalf("the CLI after the renewal: %v\n%s", err, out)
	}

	// SIGHUP: a pair of the same sizes, its times set back, which the
	// poll cannot see; SIGHUP reads it.
	third := sameSizes(t, ca, second)
	st := [2]os.FileInfo{stat(t, certFile), stat(t, keyFile)}
	tlsPair(t, third, certFile, keyFile)
	for i, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, st[i].ModTime(), st[i].ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Never(t, 2500*time.Millisecond, "the poll saw files that look unchanged", func() bool {
		return servedSerial(addr, trust) != second.Cert.SerialNumber.String()
	})
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Second, "the certificate read on SIGHUP served", func() bool {
		return servedSerial(addr, trust) == third.Cert.SerialNumber.String()
	})
	if !strings.Contains(p.logText(), "serving a new certificate") {
		t.Errorf("no log line of the new certificate:\n%s", tail(p.logText(), 2000))
	}
}

// sameSizes issues certificates until one has the files' sizes of was.
func sameSizes(t *testing.T, ca *testenv.CA, was testenv.Issued) testenv.Issued {
	t.Helper()
	for range 200 {
		is := ca.Server("third", 72*time.Hour)
		if stat(t, is.CertFile).Size() == stat(t, was.CertFile).Size() && stat(t, is.KeyFile).Size() == stat(t, was.KeyFile).Size() {
			return is
		}
	}
	t.Fatal("no certificate of the same size in 200 tries")
	return testenv.Issued{}
}

func stat(t *testing.T, f string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// TestHTTPSMutualTLS serves the API with http.tls.client_ca_file: a client
// without a certificate is refused at the handshake, the CLI says to give
// --cert and --key, and the CLI and the Go client with a certificate the
// CA signed get in; one of another CA does not.
func TestHTTPSMutualTLS(t *testing.T) {
	env := testenv.New(t, testenv.Options{Mosquitto: true, NATS: true})
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "ca")
	srv := ca.Server("server", 24*time.Hour)
	clients := testenv.NewCA(t, dir, "clients")
	addr := freeAddr(t)
	startProc(t, env, "mtls", "SIGWATCH_HTTP_ADDR="+addr, "SIGWATCH_HTTP_TLS_CERT_FILE="+srv.CertFile,
		"SIGWATCH_HTTP_TLS_KEY_FILE="+srv.KeyFile, "SIGWATCH_HTTP_TLS_CLIENT_CA_FILE="+clients.File)
	alice := clients.Client("alice")
	aliceCert, err := tls.LoadX509KeyPair(alice.CertFile, alice.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	withCert := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{aliceCert}}
	waitHTTPS(t, addr, withCert)
	base := "https://" + addr

	// Without a certificate: refused at the handshake.
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{RootCAs: ca.Pool()})
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("a handshake without a client certificate: %v, want refused (certificate required)", err)
	}
	if resp, err := httpsClient(&tls.Config{RootCAs: ca.Pool()}).Get(base + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /healthz without a client certificate: %s, want refused", resp.Status)
	}
	out, err := sigwatchCLI(t, nil, "stats", "--api", base, "--ca", ca.File)
	want := "sigwatch: the API at " + base + " wants a client certificate: give --cert and --key (SIGWATCH_API_CERT, SIGWATCH_API_KEY)\n"
	if err == nil || out != want {
		t.Errorf("sigwatch stats without --cert: %v, output %q, want %q", err, out, want)
	}
	out, err = sigwatchCLI(t, nil, "stats", "--api", base, "--ca", ca.File, "--cert", alice.CertFile)
	if want := "sigwatch: --cert needs --key (SIGWATCH_API_KEY): the client certificate's private key\n"; err == nil || out != want {
		t.Errorf("sigwatch stats with --cert alone: %v, output %q, want %q", err, out, want)
	}

	// With a certificate the client CA signed: the CLI and the Go client.
	out, err = sigwatchCLI(t, nil, "stats", "--api", base, "--ca", ca.File, "--cert", alice.CertFile, "--key", alice.KeyFile)
	if err != nil {
		t.Fatalf("sigwatch stats with --cert and --key: %v\n%s", err, out)
	}
	out, err = sigwatchCLI(t, []string{"SIGWATCH_API=" + base, "SIGWATCH_API_CA=" + ca.File,
		"SIGWATCH_API_CERT=" + alice.CertFile, "SIGWATCH_API_KEY=" + alice.KeyFile}, "device", "ls")
	if err != nil {
		t.Fatalf("sigwatch device ls with SIGWATCH_API_CERT and _KEY: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	gc, err := client.New(client.Options{URL: base, HTTPClient: httpsClient(withCert)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gc.Reset(ctx, "orders", "o-2", time.Hour, nil); err != nil {
		t.Fatalf("client Reset with a client certificate: %v", err)
	}

	// A certificate of another CA: refused.
	mallory := testenv.NewCA(t, dir, "other").Client("mallory")
	out, err = sigwatchCLI(t, nil, "stats", "--api", base, "--ca", ca.File, "--cert", mallory.CertFile, "--key", mallory.KeyFile)
	if err == nil || !strings.HasPrefix(out, "sigwatch: the API at "+base+" refused the client certificate (") || strings.Count(out, "\n") != 1 {
		t.Errorf("sigwatch stats with a certificate of another CA: %v, output %q", err, out)
	}
}

// TestHTTPSConfigErrors: config check and run name the wrong file of
// http.tls in one line.
func TestHTTPSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "ca")
	a, b := ca.Server("a", time.Hour), ca.Server("b", time.Hour)
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"SIGWATCH_HTTP_TLS_CERT_FILE=" + a.CertFile}, "http.tls.cert_file is set without http.tls.key_file"},
		{[]string{"SIGWATCH_HTTP_TLS_KEY_FILE=" + a.KeyFile}, "http.tls.key_file is set without http.tls.cert_file"},
		{[]string{"SIGWATCH_HTTP_TLS_CLIENT_CA_FILE=" + ca.File}, "http.tls.client_ca_file needs http.tls.cert_file"},
		{[]string{"SIGWATCH_HTTP_TLS_CERT_FILE=" + missing, "SIGWATCH_HTTP_TLS_KEY_FILE=" + a.KeyFile}, "http.tls.cert_file " + missing + ": no such file or directory"},
		{[]string{"SIGWATCH_HTTP_TLS_CERT_FILE=" + a.CertFile, "SIGWATCH_HTTP_TLS_KEY_FILE=" + b.KeyFile}, "http.tls.cert_file " + a.CertFile + " and key_file " + b.KeyFile + " are not a certificate and its key (PEM): private key does not match public key"},
		{[]string{"SIGWATCH_HTTP_TLS_CERT_FILE=" + a.CertFile, "SIGWATCH_HTTP_TLS_KEY_FILE=" + a.KeyFile, "SIGWATCH_HTTP_TLS_CLIENT_CA_FILE=" + a.KeyFile}, "http.tls.client_ca_file " + a.KeyFile + ": no PEM certificate in it"},
	} {
		for _, verb := range [][]string{{"config", "check"}, {"run"}} {
			out, err := sigwatchCLI(t, c.env, verb...)
			if err == nil || !strings.Contains(out, c.want) || strings.Count(out, "\n") != 1 {
				t.Errorf("sigwatch %s with %v: %v, output %q, want one line with %q", strings.Join(verb, " "), c.env, err, out, c.want)
			}
		}
	}
}
