package client_test

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"time"

	"github.com/sigwatch/sigwatch/client"
)

// An API served over HTTPS (http.tls) with a private CA, and mutual TLS
// (http.tls.client_ca_file): the client is given an *http.Client that
// trusts the CA and shows its certificate.
func Example_https() {
	caPEM, err := os.ReadFile("/etc/sigwatch/ca.pem")
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair("/etc/billing/client.pem", "/etc/billing/client-key.pem")
	if err != nil {
		panic(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	}}
	c, err := client.New(client.Options{URL: "https://sigwatch.example.com:8080", Token: os.Getenv("SIGWATCH_TOKEN"), HTTPClient: hc})
	if err != nil {
		panic(err)
	}
	_ = c
}
