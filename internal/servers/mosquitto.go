package servers

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MosquittoOptions configures StartMosquitto.
type MosquittoOptions struct {
	// Username and Password, when Username is set, are the only credentials the broker accepts;
	// otherwise anonymous clients are allowed.
	Username, Password string
	// TLS, when set, makes the listener speak only TLS with these files (clients are not asked
	// for certificates), and URL is ssl://host:port.
	TLS *TLSFiles
	// Port is the port to listen on; 0 picks a free one (and another if it is taken meanwhile).
	Port int
	// MaxQueuedMessages, when above 0, is the broker's max_queued_messages: a session's queue
	// beyond it is dropped (and counted in $SYS), as with Mosquitto's own default of 1000.
	MaxQueuedMessages int
}

// Mosquitto is a mosquitto broker child process listening on 127.0.0.1.
type Mosquitto struct {
	Addr string // host:port
	URL  string // tcp://host:port, or ssl://host:port with MosquittoOptions.TLS, for paho
	Dir  string // working directory: mosquitto.conf, passwd, mosquitto.db, mosquitto.log

	child // the current run; serialises Kill, Stop and Restart
	bin   string
	port  int
	opts  MosquittoOptions
}

// StartMosquitto writes dir/mosquitto.conf, starts mosquitto with it on a free port of 127.0.0.1
// and returns once the port accepts connections. The config is tuned as
// deploy/local/mosquitto.conf is, so tests see what production sees: no silent drops of queued
// QoS 1 messages, persistence, $SYS statistics every second.
func StartMosquitto(dir string, opts MosquittoOptions) (*Mosquitto, error) {
	bin, dir, err := locate("mosquitto", "mosquitto", dir)
	if err != nil {
		return nil, err
	}
	m := &Mosquitto{Dir: dir, child: child{name: "mosquitto"}, bin: bin, opts: opts}
	if opts.Username != "" {
		if err := m.writePasswordFile(); err != nil {
			return nil, fmt.Errorf("servers: start mosquitto: %w", err)
		}
	}
	start := onFreePort
	if opts.Port != 0 {
		start = func(f func(int) error) error { return f(opts.Port) }
	}
	if err := start(m.start); err != nil {
		return nil, fmt.Errorf("servers: start mosquitto: %w", err)
	}
	return m, nil
}

// LogPath is the file mosquitto writes its log to.
func (m *Mosquitto) LogPath() string { return filepath.Join(m.Dir, "mosquitto.log") }

func (m *Mosquitto) confPath() string   { return filepath.Join(m.Dir, "mosquitto.conf") }
func (m *Mosquitto) passwdPath() string { return filepath.Join(m.Dir, "passwd") }

func (m *Mosquitto) writePasswordFile() error {
	bin, err := LookPath("mosquitto_passwd")
	if err != nil {
		return err
	}
	out, err := runCommand(bin, "-c", "-b", m.passwdPath(), m.opts.Username, m.opts.Password)
	if err != nil {
		return fmt.Errorf("mosquitto_passwd: %w: %s", err, out)
	}
	return nil
}

func (m *Mosquitto) writeConf(port int) error {
	var b strings.Builder
	b.WriteString("# Written by sigwatch internal/servers; see deploy/local/mosquitto.conf for why.\n")
	fmt.Fprintf(&b, "listener %d 127.0.0.1\n", port)
	if f := m.opts.TLS; f != nil {
		// These apply to the listener above.
		fmt.Fprintf(&b, "certfile %s\n", f.CertFile)
		fmt.Fprintf(&b, "keyfile %s\n", f.KeyFile)
		fmt.Fprintf(&b, "cafile %s\n", f.CAFile)
		b.WriteString("require_certificate false\n")
	}
	if m.opts.Username != "" {
		b.WriteString("allow_anonymous false\n")
		fmt.Fprintf(&b, "password_file %s\n", m.passwdPath())
	} else {
		b.WriteString("allow_anonymous true\n")
	}
	b.WriteString("persistence true\n")
	fmt.Fprintf(&b, "persistence_location %s/\n", m.Dir)
	b.WriteString("max_inflight_messages 1000\n")
	fmt.Fprintf(&b, "max_queued_messages %d\n", m.opts.MaxQueuedMessages)
	b.WriteString("sys_interval 1\n")
	b.WriteString("log_dest stderr\n")
	if os.Geteuid() == 0 {
		// Run as root, mosquitto switches to the "mosquitto" user, which cannot write to a
		// directory that root created with mode 0700 (as t.TempDir does).
		b.WriteString("user root\n")
	}
	return os.WriteFile(m.confPath(), []byte(b.String()), 0o644)
}

// start writes the config for port, runs mosquitto and waits for the port to accept connections.
// The caller holds m.mu or owns m alone.
func (m *Mosquitto) start(port int) error {
	if err := m.writeConf(port); err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p, err := startProcess(m.bin, []string{"-c", m.confPath()}, m.Dir, m.LogPath())
	if err != nil {
		return err
	}
	// A TCP connect is enough for TLS too: mosquitto accepts only once the listener, with its
	// certificate loaded, is up.
	if err := p.waitReady(func() error { return dialable(addr) }); err != nil {
		return err
	}
	scheme := "tcp://"
	if m.opts.TLS != nil {
		scheme = "ssl://"
	}
	m.cmd, m.port, m.Addr, m.URL = p, port, addr, scheme+addr
	return nil
}

// Kill stops mosquitto with SIGKILL, as a crash would: what it has not yet saved to
// mosquitto.db (it saves on Stop) is lost.
func (m *Mosquitto) Kill() error { return m.child.kill() }

// Stop asks mosquitto to shut down (SIGTERM), which saves its persistent state, and waits; it
// kills it after 5s.
func (m *Mosquitto) Stop() error { return m.child.stop() }

// Restart starts mosquitto again on the same port, directory and persistence file. A broker that
// is still running is stopped first.
func (m *Mosquitto) Restart() error { return m.child.restart(func() error { return m.start(m.port) }) }
