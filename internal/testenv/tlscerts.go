package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a throwaway certificate authority of one test: it signs server
// certificates for 127.0.0.1, ::1 and localhost, and client certificates.
type CA struct {
	// File is the CA's certificate (PEM), what a peer is told to trust.
	File string
	Cert *x509.Certificate

	t   *testing.T
	dir string
	key *ecdsa.PrivateKey
}

// Issued is a certificate the CA signed and its key, as PEM files.
type Issued struct {
	CertFile, KeyFile string
	Cert              *x509.Certificate
}

// NewCA makes a CA in dir (t.TempDir() when ""), valid for a day.
func NewCA(t *testing.T, dir, name string) *CA {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{File: filepath.Join(dir, name+".pem"), Cert: cert, t: t, dir: dir, key: key}
	writePEMFile(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Server issues a server certificate as name.pem and name-key.pem, valid
// for the given time from now (a negative one gives an expired one).
func (ca *CA) Server(name string, valid time.Duration) Issued {
	return ca.issue(name, valid, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate for mutual TLS, valid for a day.
func (ca *CA) Client(name string) Issued {
	return ca.issue(name, 24*time.Hour, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) issue(name string, valid time.Duration, usage x509.ExtKeyUsage) Issued {
	t := ca.t
	t.Helper()
	key := newKey(t)
	notAfter, notBefore := time.Now().Add(valid), time.Now().Add(-time.Hour)
	if notBefore.After(notAfter) {
		notBefore = notAfter.Add(-time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	is := Issued{CertFile: filepath.Join(ca.dir, name+".pem"), KeyFile: filepath.Join(ca.dir, name+"-key.pem"), Cert: cert}
	writePEMFile(t, is.CertFile, "CERTIFICATE", der)
	writePEMFile(t, is.KeyFile, "EC PRIVATE KEY", keyDER)
	return is
}

// Pool is a pool holding only the CA, for a client's RootCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func writePEMFile(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
