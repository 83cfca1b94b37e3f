package servers

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
)

// RedisOptions configures StartRedis.
type RedisOptions struct {
	// Persist turns on the append-only file (appendfsync everysec) and Redis's default RDB save
	// points, so that data written before Kill is there after Restart. Without it nothing is
	// written to disk.
	Persist bool
	// Password, when set, is required from clients (requirepass).
	Password string
	// TLS, when set, makes redis-server also listen for TLS on a second free port (TLSAddr) with
	// these files. Clients are not asked for certificates. The plain port stays open: this
	// package checks readiness on it, and a test can use it to look behind a TLS client's back.
	TLS *TLSFiles
	// Port is the port to listen on; 0 picks a free one (and another if it is taken meanwhile).
	Port int
	// ExtraArgs are appended to the redis-server command line and so override the defaults,
	// e.g. []string{"--maxmemory", "100mb"}.
	ExtraArgs []string
}

// Redis is a redis-server child process listening on 127.0.0.1.
type Redis struct {
	Addr     string // host:port
	TLSAddr  string // host:port of the TLS listener; "" without RedisOptions.TLS
	Dir      string // working directory: data files and redis.log
	Password string

	child   // the current run; serialises Kill, Stop and Restart
	bin     string
	port    int
	tlsPort int // 0 without RedisOptions.TLS
	opts    RedisOptions
}

// StartRedis starts redis-server in dir (created if needed) on a free port of 127.0.0.1 and
// returns once it answers PING.
func StartRedis(dir string, opts RedisOptions) (*Redis, error) {
	bin, dir, err := locate("redis", "redis-server", dir)
	if err != nil {
		return nil, err
	}
	r := &Redis{Dir: dir, Password: opts.Password, child: child{name: "redis"}, bin: bin, opts: opts}
	start := onFreePort
	if opts.Port != 0 {
		start = func(f func(int) error) error { return f(opts.Port) }
	}
	err = start(func(port int) error {
		tlsPort := 0
		if opts.TLS != nil {
			var err error
			if tlsPort, err = FreePort(); err != nil {
				return err
			}
		}
		return r.start(port, tlsPort)
	})
	if err != nil {
		return nil, fmt.Errorf("servers: start redis: %w", err)
	}
	return r, nil
}

// LogPath is the file redis-server writes its log to.
func (r *Redis) LogPath() string { return filepath.Join(r.Dir, "redis.log") }

func (r *Redis) args(port, tlsPort int) []string {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", r.Dir,
		"--daemonize", "no",
	}
	if r.opts.Persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		args = append(args, "--save", "", "--appendonly", "no")
	}
	if r.opts.Password != "" {
		args = append(args, "--requirepass", r.opts.Password)
	}
	if f := r.opts.TLS; f != nil {
		args = append(args,
			"--tls-port", strconv.Itoa(tlsPort),
			"--tls-cert-file", f.CertFile,
			"--tls-key-file", f.KeyFile,
			"--tls-ca-cert-file", f.CAFile,
			"--tls-auth-clients", "no",
		)
	}
	return append(args, r.opts.ExtraArgs...)
}

// start runs redis-server on port (and tlsPort, with TLS) and waits for PING on the plain port.
// The caller holds r.mu or owns r alone.
func (r *Redis) start(port, tlsPort int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	tlsAddr := ""
	if r.opts.TLS != nil {
		tlsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	}
	p, err := startProcess(r.bin, r.args(port, tlsPort), r.Dir, r.LogPath())
	if err != nil {
		return err
	}
	err = p.waitReady(func() error {
		// A Redis loading its AOF answers -LOADING, which redisDo returns as an error.
		if _, err := redisDo(addr, r.opts.Password, "PING"); err != nil {
			return err
		}
		// Redis binds every listener before it serves any, so this holds at once; it is
		// checked so that a TLS listener that failed cannot pass unnoticed.
		if tlsAddr != "" {
			return dialable(tlsAddr)
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.cmd, r.port, r.tlsPort, r.Addr, r.TLSAddr = p, port, tlsPort, addr, tlsAddr
	return nil
}

// Kill stops redis-server with SIGKILL, as a crash would, and waits until it has exited.
func (r *Redis) Kill() error { return r.child.kill() }

// Stop asks redis-server to shut down (SIGTERM) and waits; it kills it after 5s.
func (r *Redis) Stop() error { return r.child.stop() }

// Restart starts redis-server again on the same ports (plain and TLS) and directory, as after an
// outage, and waits for PING. A server that is still running is stopped first. With Persist, the
// data written before a Kill or Stop is loaded again.
func (r *Redis) Restart() error {
	return r.child.restart(func() error { return r.start(r.port, r.tlsPort) })
}

// running reports whether the current run of redis-server has started and not exited. A
// paused server is running.
func (r *Redis) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd != nil && !r.cmd.exited()
}
