package servers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// TLSFiles names the PEM files a server needs to accept TLS: its certificate chain, its private
// key and the CA that signed it (which clients are given to verify the server).
type TLSFiles struct {
	CertFile, KeyFile, CAFile string
}

// ServerTLS loads the files into a server-side *tls.Config, e.g. for NATSOptions.TLS.
func (f TLSFiles) ServerTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("servers: load server certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// ClientTLS returns a client-side *tls.Config that trusts only CAFile, as a client of a server
// set up with these files would use. It is built as sigwatch builds its own clients' TLS, from
// a tls section that names only the CA.
func (f TLSFiles) ClientTLS() (*tls.Config, error) {
	c, err := tlsconfig.Config{Enabled: true, CAFile: f.CAFile}.Build()
	if err != nil {
		return nil, fmt.Errorf("servers: client TLS: %w", err)
	}
	return c, nil
}

// WriteTestCerts makes a throwaway CA and a server certificate it signs, valid for a day for
// 127.0.0.1, ::1 and localhost, and writes them to dir (created if needed) as ca.pem, server.pem
// and server-key.pem. The keys are ECDSA P-256. The CA's key is not kept: nothing else can be
// signed with it.
func WriteTestCerts(dir string) (TLSFiles, error) {
	dir, err := prepareDir(dir)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("servers: certs dir: %w", err)
	}
	files := TLSFiles{
		CertFile: filepath.Join(dir, "server.pem"),
		KeyFile:  filepath.Join(dir, "server-key.pem"),
		CAFile:   filepath.Join(dir, "ca.pem"),
	}
	caDER, serverDER, serverKey, err := makeTestCerts(time.Now())
	if err != nil {
		return TLSFiles{}, fmt.Errorf("servers: make test certificates: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("servers: marshal server key: %w", err)
	}
	err = errors.Join(
		writePEM(files.CAFile, "CERTIFICATE", caDER, 0o644),
		writePEM(files.CertFile, "CERTIFICATE", serverDER, 0o644),
		writePEM(files.KeyFile, "EC PRIVATE KEY", keyDER, 0o600),
	)
	if err != nil {
		return TLSFiles{}, fmt.Errorf("servers: write test certificates: %w", err)
	}
	return files, nil
}

// makeTestCerts returns a self-signed CA certificate and a server certificate signed by it, both
// DER-encoded, and the server's key.
func makeTestCerts(now time.Time) (caDER, serverDER []byte, serverKey *ecdsa.PrivateKey, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	serverKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	// Backdated a little, so a server whose clock is slightly behind still accepts it.
	notBefore, notAfter := now.Add(-time.Hour), now.Add(24*time.Hour)

	ca := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{Organization: []string{"sigwatch tests"}, CommonName: "sigwatch test CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err = x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}

	srv := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{Organization: []string{"sigwatch tests"}, CommonName: "localhost"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	serverDER, err = x509.CreateCertificate(rand.Reader, srv, caCert, &serverKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	return caDER, serverDER, serverKey, nil
}

func randomSerial() *big.Int {
	// 128 random bits; rand.Int only fails if the reader does, which crypto/rand does not.
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	return n
}

func writePEM(path, blockType string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), mode)
}
