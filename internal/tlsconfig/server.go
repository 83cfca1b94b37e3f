package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is the TLS of a server whose certificate files are replaced on disk
// (cert-manager, a renewed Let's Encrypt pair): handshakes get the pair last
// read whole, so a pair written half-way keeps the one in use until the next
// change makes it whole again.
type Server struct {
	certFile, keyFile, caFile string
	log                       *slog.Logger

	cert atomic.Pointer[tls.Certificate]
	pool atomic.Pointer[x509.CertPool] // nil without a client CA

	mu   sync.Mutex // one reload at a time; guards seen
	seen [3]stamp   // cert, key, CA as last read
}

// stamp is what a poll compares: a rename, a rewrite or a truncation
// changes one of them.
type stamp struct {
	mod  time.Time
	size int64
}

// NewServer reads certFile and keyFile (and clientCAFile, when given: the
// clients must then show a certificate it signed). Its errors name the file
// and say what is wrong with it in plain words.
func NewServer(certFile, keyFile, clientCAFile string, log *slog.Logger) (*Server, error) {
	s := &Server{certFile: certFile, keyFile: keyFile, caFile: clientCAFile, log: log}
	s.seen = s.stamps()
	cert, err := LoadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	s.cert.Store(&cert)
	if clientCAFile != "" {
		pool, err := LoadPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		s.pool.Store(pool)
	}
	return s, nil
}

// Config is the server's *tls.Config: TLS 1.2 or later, the current
// certificate at each handshake and, with a client CA, its current pool.
func (s *Server) Config() *tls.Config {
	getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Load(), nil }
	base := func() *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCert, NextProtos: []string{"h2", "http/1.1"}}
	}
	c := base()
	if s.caFile != "" {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = s.pool.Load()
		c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cc := base()
			cc.ClientAuth, cc.ClientCAs = tls.RequireAndVerifyClientCert, s.pool.Load()
			return cc, nil
		}
	}
	return c
}

// Serial is the serial number of the certificate served now, for logs
// and tests.
func (s *Server) Serial() string {
	if c := s.cert.Load(); c.Leaf != nil {
		return c.Leaf.SerialNumber.String()
	}
	return ""
}

// Watch reloads whenever a file's modification time or size changes,
// looking every period, until ctx ends.
func (s *Server) Watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		changed := s.stamps() != s.seen
		s.mu.Unlock()
		if changed {
			s.Reload()
		}
	}
}

// Reload reads the files again now (SIGHUP). What cannot be read whole is
// logged and the files in use are kept; the next change tries again.
func (s *Server) Reload() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = s.stamps()
	cert, err := LoadPair(s.certFile, s.keyFile)
	switch {
	case err != nil:
		s.log.Warn("kept the certificate in use: "+err.Error(), "serial", s.Serial())
	case !sameCert(&cert, s.cert.Load()):
		s.cert.Store(&cert)
		s.log.Info("serving a new certificate", "cert_file", s.certFile, "serial", s.Serial(), "not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if s.caFile == "" {
		return
	}
	pool, err := LoadPool(s.caFile)
	if err != nil {
		s.log.Warn("kept the client CAs in use: " + err.Error())
		return
	}
	if !pool.Equal(s.pool.Load()) {
		s.pool.Store(pool)
		s.log.Info("trusting new client CAs", "client_ca_file", s.caFile)
	}
}

func sameCert(a, b *tls.Certificate) bool {
	if len(a.Certificate) != len(b.Certificate) {
		return false
	}
	for i := range a.Certificate {
		if string(a.Certificate[i]) != string(b.Certificate[i]) {
			return false
		}
	}
	return true
}

func (s *Server) stamps() [3]stamp {
	var st [3]stamp
	for i, f := range []string{s.certFile, s.keyFile, s.caFile} {
		if f == "" {
			continue
		}
		if fi, err := os.Stat(f); err == nil { // a missing file reads as a change once it is back
			st[i] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	return st
}

// LoadPair reads a certificate (PEM, chain first) and its private key.
func LoadPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("cert_file %s: %s", certFile, fileError(err))
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("key_file %s: %s", keyFile, fileError(err))
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("cert_file %s and key_file %s are not a certificate and its key (PEM): %s",
			certFile, keyFile, strings.TrimPrefix(err.Error(), "tls: "))
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return tls.Certificate{}, fmt.Errorf("cert_file %s: %v", certFile, err)
		}
	}
	return cert, nil
}

// LoadPool reads CA certificates (PEM).
func LoadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("client_ca_file %s: %s", file, fileError(err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("client_ca_file %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// fileError is why a file could not be read, without the Go wrapping.
func fileError(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err.Error()
}
