package servers

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSOptions configures StartNATS.
type NATSOptions struct {
	// JetStream enables JetStream, stored under the server's directory.
	JetStream bool
	// MQTT enables nats-server's MQTT listener on a free port. It needs JetStream and a server
	// name, so it turns JetStream on.
	MQTT bool
	// Port is the client port; 0 picks a free one.
	Port int
	// User and Password, when User is set, are the only credentials the server accepts, on the
	// client port and on the MQTT listener; otherwise clients need none.
	User, Password string
	// TLS, when set, makes the client port require TLS with this configuration (see
	// TLSFiles.ServerTLS); URL is then tls://host:port. The MQTT listener stays plain.
	TLS *tls.Config
	// SystemUser and SystemPassword, when SystemUser is set, make a system account SYS with this
	// one user, who sees the server's advisories ($SYS.ACCOUNT.>). Every other client is in an
	// account APP with JetStream: with User set, by those credentials; otherwise without any,
	// on the client port and the MQTT listener alike, as without accounts.
	SystemUser, SystemPassword string
}

// NATS is an nats-server embedded in this process, listening on 127.0.0.1.
type NATS struct {
	URL      string // nats://host:port, or tls://host:port with NATSOptions.TLS
	MQTTAddr string // host:port of the MQTT listener, when enabled
	MQTTURL  string // tcp://host:port of the MQTT listener, for paho
	Dir      string // JetStream store (Dir/jetstream) and nats.log
	// Server is the running server. Restart replaces it.
	Server *server.Server

	mu       sync.Mutex // serialises Shutdown and Restart
	opts     NATSOptions
	port     int
	mqttPort int
	logger   *natsLogger
}

// StartNATS starts an embedded nats-server with its store in dir (created if needed) and returns
// once it is ready for connections.
func StartNATS(dir string, opts NATSOptions) (*NATS, error) {
	dir, err := prepareDir(dir)
	if err != nil {
		return nil, fmt.Errorf("servers: nats dir: %w", err)
	}
	n := &NATS{Dir: dir, opts: opts, port: server.RANDOM_PORT}
	if opts.Port != 0 {
		n.port = opts.Port
	}
	if opts.MQTT {
		n.mqttPort = server.RANDOM_PORT
	}
	// With random ports the server binds port 0 itself, so there is no race to retry.
	if err := n.start(); err != nil {
		return nil, fmt.Errorf("servers: start nats: %w", err)
	}
	return n, nil
}

// LogPath is the file the server logs to.
func (n *NATS) LogPath() string { return filepath.Join(n.Dir, "nats.log") }

// start runs a new server on n.port and n.mqttPort and records the ports it got. The caller holds
// n.mu or owns n alone.
func (n *NATS) start() error {
	o := &server.Options{
		ServerName: "sigwatch",
		Host:       "127.0.0.1",
		Port:       n.port,
		JetStream:  n.opts.JetStream || n.opts.MQTT,
		StoreDir:   n.Dir,
		NoSigs:     true,
	}
	if n.opts.MQTT {
		o.MQTT.Host = "127.0.0.1"
		o.MQTT.Port = n.mqttPort
	}
	if n.opts.SystemUser != "" {
		if err := n.accounts(o); err != nil {
			return err
		}
	} else if n.opts.User != "" {
		o.Username, o.Password = n.opts.User, n.opts.Password
	}
	if n.opts.TLS != nil {
		// The server keeps using the config it was given; a clone keeps Restart's server
		// independent of the previous one.
		o.TLS, o.TLSConfig = true, n.opts.TLS.Clone()
	}
	s, err := server.NewServer(o)
	if err != nil {
		return err
	}
	logger, err := newNATSLogger(n.LogPath())
	if err != nil {
		return err
	}
	s.SetLoggerV2(logger, false, false, false)
	s.Start()

	deadline := time.Now().Add(readyTimeout)
	for !s.ReadyForConnections(20 * time.Millisecond) {
		if msg := logger.fatal(); msg != "" || time.Now().After(deadline) {
			s.Shutdown()
			s.WaitForShutdown()
			logger.close()
			if msg == "" {
				msg = fmt.Sprintf("not ready after %v", readyTimeout)
			}
			if strings.Contains(strings.ToLower(msg), "address already in use") {
				return fmt.Errorf("%w: %s", errAddrInUse, msg)
			}
			return errors.New(msg)
		}
	}

	n.Server, n.logger = s, logger
	n.port = s.Addr().(*net.TCPAddr).Port
	n.URL = s.ClientURL()
	if n.opts.MQTT {
		v, err := s.Varz(&server.VarzOptions{})
		if err != nil {
			return fmt.Errorf("mqtt port: %w", err)
		}
		n.mqttPort = v.MQTT.Port
		n.MQTTAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.mqttPort))
		n.MQTTURL = "tcp://" + n.MQTTAddr
	}
	return nil
}

// accounts gives o the accounts of NATSOptions.SystemUser: APP (JetStream) and SYS, the system
// account. They are written as configuration, the one way to enable JetStream in an account.
func (n *NATS) accounts(o *server.Options) error {
	app, appPassword, noAuth := n.opts.User, n.opts.Password, ""
	if app == "" {
		app, appPassword, noAuth = "app", "app", "no_auth_user: app"
	}
	conf := fmt.Sprintf(`accounts {
  APP { jetstream: enabled, users: [{user: %q, password: %q}] }
  SYS { users: [{user: %q, password: %q}] }
}
system_account: SYS
%s
`, app, appPassword, n.opts.SystemUser, n.opts.SystemPassword, noAuth)
	return o.ProcessConfigString(conf)
}

// Shutdown stops the server and waits until it has. JetStream state stays in Dir.
func (n *NATS) Shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.shutdown()
}

func (n *NATS) shutdown() {
	if n.Server == nil {
		return
	}
	n.Server.Shutdown()
	n.Server.WaitForShutdown()
	n.logger.close()
}

// Restart starts a new server on the same ports and store directory, so JetStream streams and
// their messages survive. A server that is still running is shut down first.
func (n *NATS) Restart() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.shutdown()
	return restartOnPort("nats", n.start)
}

// natsLogger writes the server's log to a file. Unlike the server's own file logger its Fatalf
// does not exit the process: a port that is taken must fail one start, not the test binary.
type natsLogger struct {
	f *os.File
	l *log.Logger

	mu       sync.Mutex
	fatalMsg string
}

func newNATSLogger(path string) (*natsLogger, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &natsLogger{f: f, l: log.New(f, "", log.LstdFlags|log.Lmicroseconds)}, nil
}

func (l *natsLogger) Noticef(format string, v ...any) { l.l.Printf("[INF] "+format, v...) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.l.Printf("[WRN] "+format, v...) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.l.Printf("[ERR] "+format, v...) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.l.Printf("[DBG] "+format, v...) }
func (l *natsLogger) Tracef(format string, v ...any)  { l.l.Printf("[TRC] "+format, v...) }

func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.l.Print("[FTL] " + msg)
	l.mu.Lock()
	if l.fatalMsg == "" {
		l.fatalMsg = msg
	}
	l.mu.Unlock()
}

// fatal returns the first fatal message logged, or "".
func (l *natsLogger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatalMsg
}

// close closes the log file. Late log calls from the server's goroutines then fail silently.
func (l *natsLogger) close() { l.f.Close() }
