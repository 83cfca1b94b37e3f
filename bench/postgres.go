//go:build linux

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// pgServer is a PostgreSQL server started by the harness in a temporary
// directory, on a free port of 127.0.0.1.
type pgServer struct {
	dir     string
	dsn     string
	version string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// startPostgres starts PostgreSQL if its binaries are installed. A non-empty
// reason says why it was not started (not installed, no user to run it as).
func startPostgres(parent string) (_ *pgServer, reason string, err error) {
	initdb, err := pgBinary("initdb")
	if err != nil {
		return nil, "initdb not found (Debian: apt-get install postgresql)", nil
	}
	postgres, err := pgBinary("postgres")
	if err != nil {
		return nil, "postgres binary not found next to initdb", nil
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, "running as root and there is no postgres user to run PostgreSQL as", nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// The harness's own directory may not be reachable by that user.
	dir, err := os.MkdirTemp("", "sigwatch-bench-pg-")
	if err != nil {
		return nil, "", err
	}
	pg := &pgServer{dir: dir, exited: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			pg.stop()
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, "", err
		}
	}
	data := filepath.Join(dir, "data")
	run := func(bin string, args ...string) error {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", filepath.Base(bin), err, out)
		}
		return nil
	}
	if err := run(initdb, "-D", data, "-U", "bench", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return nil, "", err
	}
	out, _ := exec.Command(postgres, "--version").Output()
	pg.version = strings.TrimPrefix(strings.TrimSpace(string(out)), "postgres (PostgreSQL) ")

	port, err := servers.FreePort()
	if err != nil {
		return nil, "", err
	}
	logf, err := os.Create(filepath.Join(parent, "postgres.log"))
	if err != nil {
		return nil, "", err
	}
	defer logf.Close()
	pg.cmd = exec.Command(postgres, "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "synchronous_commit=off", "-c", "shared_buffers=256MB",
		"-c", "max_connections=50")
	pg.cmd.Dir = dir
	pg.cmd.Stdout, pg.cmd.Stderr = logf, logf
	// Pdeathsig kills PostgreSQL if the harness dies. It fires when the
	// thread that started the child exits, so that thread stays locked to
	// the goroutine that waits for the child.
	pg.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer close(pg.exited)
		if err := pg.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		pg.cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, "", fmt.Errorf("start postgres: %w", err)
	}
	pg.dsn = fmt.Sprintf("postgres://bench@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := pgx.Connect(context.Background(), pg.dsn)
		if err == nil {
			c.Close(context.Background())
			break
		}
		select {
		case <-pg.exited:
			return nil, "", fmt.Errorf("postgres exited during start-up: %s", servers.LogTail(logf.Name()))
		default:
		}
		if time.Now().After(deadline) {
			return nil, "", fmt.Errorf("postgres not ready after 30s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ok = true
	return pg, "", nil
}

// pgBinary finds a PostgreSQL binary on PATH or in Debian's versioned
// directories.
func pgBinary(name string) (string, error) {
	if p, err := servers.LookPath(name); err == nil {
		// Debian links initdb and pg_ctl into PATH, not postgres: look
		// beside the real file.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return p, nil
	}
	if name == "postgres" {
		if p, err := pgBinary("initdb"); err == nil {
			cand := filepath.Join(filepath.Dir(p), "postgres")
			if _, err := os.Stat(cand); err == nil {
				return cand, nil
			}
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) == 0 {
		return "", fmt.Errorf("%s not found", name)
	}
	return matches[len(matches)-1], nil
}

// cpu returns the CPU time of the postmaster and its live backends.
func (pg *pgServer) cpu() time.Duration {
	if pg.cmd == nil || pg.cmd.Process == nil {
		return 0
	}
	root := pg.cmd.Process.Pid
	total := childCPU(root)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		j := strings.LastIndexByte(s, ')')
		if f := strings.Fields(s[j+1:]); len(f) > 2 && f[1] == strconv.Itoa(root) {
			total += childCPU(pid)
		}
	}
	return total
}

// stop shuts PostgreSQL down fast and removes its directory.
func (pg *pgServer) stop() {
	if pg.cmd != nil && pg.cmd.Process != nil {
		pg.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-pg.exited:
		case <-time.After(10 * time.Second):
			pg.cmd.Process.Kill()
			<-pg.exited
		}
	}
	os.RemoveAll(pg.dir)
}
