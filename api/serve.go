package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sigwatch/sigwatch/internal/tlsconfig"
)

// ServerTLS is http.tls: HTTPS with a certificate reloaded when its files
// change, and mutual TLS when a client CA is given.
type ServerTLS struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// tlsPoll is how often the certificate files are looked at for a change.
const tlsPoll = time.Second

// validate reads the files, so that `config check` names a wrong one.
func (c ServerTLS) validate() error {
	switch {
	case c.CertFile == "" && c.KeyFile != "":
		return errors.New("http.tls.key_file is set without http.tls.cert_file: give both, or neither for plain HTTP")
	case c.CertFile != "" && c.KeyFile == "":
		return errors.New("http.tls.cert_file is set without http.tls.key_file: give both, or neither for plain HTTP")
	case c.CertFile == "" && c.ClientCAFile != "":
		return errors.New("http.tls.client_ca_file needs http.tls.cert_file and key_file: mutual TLS is served over HTTPS only")
	case c.CertFile == "":
		return nil
	}
	_, err := c.server(slog.New(slog.DiscardHandler))
	return err
}

// server reads the files; nil when TLS is off.
func (c ServerTLS) server(log *slog.Logger) (*tlsconfig.Server, error) {
	if c.CertFile == "" {
		return nil, nil
	}
	s, err := tlsconfig.NewServer(c.CertFile, c.KeyFile, c.ClientCAFile, log)
	if err != nil {
		return nil, fmt.Errorf("http.tls.%w", err)
	}
	return s, nil
}

// Serve serves Handler on ln until ctx ends, then shuts the server down,
// letting requests in flight finish for up to five seconds. When reload
// receives (SIGHUP; nil: never) the tokens are read again. With
// http.tls.cert_file it serves HTTPS, reading the files again when they
// change on disk or when reload receives.
func (a *API) Serve(ctx context.Context, ln net.Listener, reload <-chan os.Signal) error {
	log := a.o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ts, err := a.o.TLS.server(log.With("role", "http"))
	if err != nil {
		return err
	}
	// No WriteTimeout: GET /v1/events streams for as long as it is read.
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: stdlog.New(serverLog{log}, "", 0)}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if ts != nil {
		srv.Handler = hsts(srv.Handler)
		srv.TLSConfig = ts.Config()
		ln = tls.NewListener(ln, srv.TLSConfig)
		go ts.Watch(wctx, tlsPoll)
		log.Info("serving HTTPS", "serial", ts.Serial(), "mutual_tls", a.o.TLS.ClientCAFile != "")
	}
	go func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-reload:
				if err := a.Reload(); err != nil {
					log.Error("http tokens not reloaded: the ones in force stay", "err", err)
				} else if a.tokens.enabled() {
					log.Info("http tokens reloaded")
				}
				if ts != nil {
					ts.Reload()
				}
			}
		}
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	a.auditQ.drain()
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http: %w", err)
	}
	return nil
}

// serverLog is the http.Server's own log: a failed handshake (a port
// scanner, a client without a certificate) at debug, anything else, a
// handler's panic among them, as an error.
type serverLog struct{ log *slog.Logger }

func (l serverLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if strings.Contains(msg, "TLS handshake error") {
		l.log.Debug(msg)
	} else {
		l.log.Error(msg)
	}
	return len(p), nil
}

// hsts tells browsers to come back over HTTPS only, for a year.
func hsts(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Strict-Transport-Security", "max-age=31536000")
		h.ServeHTTP(w, r)
	})
}
