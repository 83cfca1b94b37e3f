package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// tlsFlags are --ca, --cert and --key: the CA an https --api is verified
// with (beside the system's), and the client certificate of mutual TLS.
type tlsFlags struct {
	ca, cert, key *string
}

// httpClient is the client of every call, built once from the TLS flags.
func (c *apiClient) httpClient() (*http.Client, error) {
	if c.hc != nil {
		return c.hc, nil
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	cfg, err := c.tls.config()
	if err != nil {
		return nil, err
	}
	t.TLSClientConfig = cfg
	// HTTP/1.1: over HTTP/2 a refused handshake reads only as "could not
	// be established", and tlsError could not say why.
	t.ForceAttemptHTTP2 = false
	c.hc = &http.Client{Transport: t}
	return c.hc, nil
}

func (f tlsFlags) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if *f.ca != "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		b, err := os.ReadFile(*f.ca)
		if err != nil {
			return nil, fmt.Errorf("--ca %s: %s", *f.ca, plainFileError(err))
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--ca %s: no PEM certificate in it", *f.ca)
		}
		cfg.RootCAs = pool
	}
	switch {
	case *f.cert != "" && *f.key == "":
		return nil, errors.New("--cert needs --key (SIGWATCH_API_KEY): the client certificate's private key")
	case *f.cert == "" && *f.key != "":
		return nil, errors.New("--key needs --cert (SIGWATCH_API_CERT): the client certificate")
	case *f.cert != "":
		cert, err := tlsconfig.LoadPair(*f.cert, *f.key)
		if err != nil {
			return nil, errors.New(strings.NewReplacer("cert_file ", "--cert ", "key_file ", "--key ").Replace(err.Error()))
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// tlsError says in one line why the TLS handshake with the API failed, and
// which flag fixes it; "" when err is not about TLS.
func (c *apiClient) tlsError(err error) string {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var remote *net.OpError // a TLS alert from the API: "remote error: tls: ..."
	var notTLS tls.RecordHeaderError
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("the API at %s shows a certificate not signed by a CA this host trusts: give its CA with --ca FILE (SIGWATCH_API_CA)", *c.base)
	case errors.As(err, &host):
		return fmt.Sprintf("the API at %s shows a certificate that is not for %s (it is for %s): use a name it is for in --api", *c.base, host.Host, certNames(host.Certificate))
	case errors.As(err, &invalid):
		return fmt.Sprintf("the API at %s shows a certificate this host refuses: %s", *c.base, strings.TrimPrefix(invalid.Error(), "x509: "))
	case errors.As(err, &remote) && remote.Op == "remote error" && *c.tls.cert == "":
		return fmt.Sprintf("the API at %s wants a client certificate: give --cert and --key (SIGWATCH_API_CERT, SIGWATCH_API_KEY)", *c.base)
	case errors.As(err, &remote) && remote.Op == "remote error":
		// A certificate of a CA the API does not list is not even sent, so
		// "certificate required" means that too.
		return fmt.Sprintf("the API at %s refused the client certificate (%s): give one signed by a CA of its http.tls.client_ca_file", *c.base, strings.TrimPrefix(remote.Err.Error(), "tls: "))
	case errors.As(err, &notTLS):
		return fmt.Sprintf("the API at %s does not speak HTTPS: use http:// in --api", *c.base)
	}
	return ""
}

func certNames(c *x509.Certificate) string {
	if c == nil {
		return "no name"
	}
	names := append([]string{}, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		return c.Subject.CommonName
	}
	return strings.Join(names, ", ")
}

func plainFileError(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
