package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SentinelOptions configures StartRedisSentinel.
type SentinelOptions struct {
	// MasterSet is the name the sentinels monitor the master under; "sigwatch" when empty.
	MasterSet string
	// Persist turns on persistence on both data nodes, as RedisOptions.Persist does.
	Persist bool
	// Password, when set, is required by both data nodes (requirepass), used by the replica to
	// sync (masterauth) and given to the sentinels (auth-pass).
	Password string
	// SentinelPassword, when set, is required from clients of the sentinels (requirepass) and
	// used by the sentinels among themselves (sentinel-pass).
	SentinelPassword string
}

// The failover timings: short, so that a test sees a failover within seconds.
const (
	sentinelQuorum          = 2
	sentinelDownAfter       = 1000 // ms of silence before a sentinel thinks the master down
	sentinelFailoverTimeout = 3000 // ms; a failed failover is retried after twice this
)

// RedisSentinel is a Redis master, one replica and three sentinels (quorum 2) watching them,
// every one a child process on 127.0.0.1.
type RedisSentinel struct {
	// Nodes are the data nodes: Nodes[0] started as the master, Nodes[1] as its replica. After a
	// failover the roles differ; Master says which is the master now.
	Nodes     []*Redis
	Sentinels []*Sentinel

	masterSet string
	password  string

	mu     sync.Mutex
	killed string // the address KillMaster killed last
}

// StartRedisSentinel starts the master in dir/node0, its replica in dir/node1 and three
// sentinels in dir/sentinel<i> (dir is created if needed), and returns once the replica is in
// sync and every sentinel knows the master, the replica and the other two sentinels: from then
// on a kill of the master is followed by a failover.
func StartRedisSentinel(dir string, opts SentinelOptions) (*RedisSentinel, error) {
	if opts.MasterSet == "" {
		opts.MasterSet = "sigwatch"
	}
	bin, sentinelFlag, err := sentinelBinary()
	if err != nil {
		return nil, err
	}
	s := &RedisSentinel{masterSet: opts.MasterSet, password: opts.Password}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()

	// A master waits 5s by default before a diskless full sync, for more replicas to join.
	common := []string{"--repl-diskless-sync-delay", "0"}
	if opts.Password != "" {
		// The master gets masterauth too, so that it can sync once it comes back as a replica.
		common = append(common, "--masterauth", opts.Password)
	}
	master, err := StartRedis(filepath.Join(dir, "node0"), RedisOptions{Persist: opts.Persist, Password: opts.Password, ExtraArgs: common})
	if err != nil {
		return nil, err
	}
	s.Nodes = append(s.Nodes, master)
	host, port, _ := net.SplitHostPort(master.Addr)
	replica, err := StartRedis(filepath.Join(dir, "node1"), RedisOptions{
		Persist: opts.Persist, Password: opts.Password,
		ExtraArgs: append([]string{"--replicaof", host, port}, common...),
	})
	if err != nil {
		return nil, err
	}
	s.Nodes = append(s.Nodes, replica)
	// A sentinel learns of the replica from the master's INFO, which lists it once it is linked.
	if err := waitUntil(readyTimeout, func() error {
		info, err := redisDo(replica.Addr, opts.Password, "INFO", "replication")
		if err == nil && !strings.Contains(info, "master_link_status:up") {
			err = errors.New("replica not in sync with " + master.Addr)
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("servers: start redis sentinel: %w", err)
	}

	for i := range 3 {
		sn, err := startSentinel(filepath.Join(dir, fmt.Sprintf("sentinel%d", i)), bin, sentinelFlag, opts, master.Addr)
		if err != nil {
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, sn)
	}
	// Sentinels find each other through hello messages on the master, every 2s.
	want := fmt.Sprintf("name=%s,status=ok,address=%s,slaves=1,sentinels=3", opts.MasterSet, master.Addr)
	for _, sn := range s.Sentinels {
		if err := waitUntil(20*time.Second, func() error {
			info, err := redisDo(sn.Addr, opts.SentinelPassword, "INFO", "sentinel")
			if err == nil && !strings.Contains(info, want) {
				err = fmt.Errorf("sentinel %s does not see the whole set yet: %q, want %q", sn.Addr, lastLine(info), want)
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("servers: start redis sentinel: %w", err)
		}
	}
	ok = true
	return s, nil
}

// sentinelBinary finds redis-sentinel or, failing that, redis-server, which is the same program
// and runs as a sentinel with --sentinel.
func sentinelBinary() (bin string, flag []string, err error) {
	if bin, err = LookPath("redis-sentinel"); err == nil {
		return bin, nil, nil
	}
	if bin, err = LookPath("redis-server"); err == nil {
		return bin, []string{"--sentinel"}, nil
	}
	return "", nil, err
}

// SentinelAddrs are the sentinels' addresses: what a client is given as redis.addrs.
func (s *RedisSentinel) SentinelAddrs() []string {
	addrs := make([]string, len(s.Sentinels))
	for i, sn := range s.Sentinels {
		addrs[i] = sn.Addr
	}
	return addrs
}

// MasterSet is the name the sentinels monitor the master under: redis.sentinel.master_set.
func (s *RedisSentinel) MasterSet() string { return s.masterSet }

// Master returns the master's address as a majority of the sentinels report it. Sentinels that
// do not answer count as disagreeing.
func (s *RedisSentinel) Master() (string, error) {
	votes := map[string]int{}
	var errs []error
	for _, sn := range s.Sentinels {
		addr, err := sn.master(s.masterSet)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		votes[addr]++
		if votes[addr] > len(s.Sentinels)/2 {
			return addr, nil
		}
	}
	return "", fmt.Errorf("servers: no majority of sentinels names a master (%v): %w", votes, errors.Join(errs...))
}

// KillMaster kills the data node the sentinels name as master with SIGKILL, as a crash would,
// and returns its address.
func (s *RedisSentinel) KillMaster() (string, error) {
	addr, err := s.Master()
	if err != nil {
		return "", err
	}
	for _, n := range s.Nodes {
		if n.Addr == addr {
			if err := n.Kill(); err != nil {
				return "", err
			}
			s.mu.Lock()
			s.killed = addr
			s.mu.Unlock()
			return addr, nil
		}
	}
	return "", fmt.Errorf("servers: the sentinels name %s as master, which is none of the data nodes", addr)
}

// WaitFailover waits until a majority of the sentinels name a master other than the one
// KillMaster killed last, and that master accepts writes; it returns its address. Before any
// KillMaster it waits for the current master to accept writes.
func (s *RedisSentinel) WaitFailover(ctx context.Context) (string, error) {
	s.mu.Lock()
	killed := s.killed
	s.mu.Unlock()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		addr, err := s.Master()
		if err == nil {
			if addr == killed {
				err = fmt.Errorf("the sentinels still name %s, which was killed", addr)
			} else {
				err = s.writable(addr)
			}
		}
		if err == nil {
			return addr, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("servers: wait for failover: %w (last: %v)", ctx.Err(), last)
		case <-t.C:
		}
	}
}

// writable checks that the Redis at addr takes a write: a replica refuses it with -READONLY.
// The probe key expires at once, so it leaves nothing behind.
func (s *RedisSentinel) writable(addr string) error {
	_, err := redisDo(addr, s.password, "SET", "servers:sentinel:probe", "1", "PX", "1")
	return err
}

// Stop stops the sentinels first, so that they start no failover while the data nodes go
// down, then the data nodes, each group in parallel.
func (s *RedisSentinel) Stop() {
	var wg sync.WaitGroup
	for _, sn := range s.Sentinels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sn.Stop()
		}()
	}
	wg.Wait()
	for _, n := range s.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Stop()
		}()
	}
	wg.Wait()
}

// Sentinel is one redis-sentinel child process listening on 127.0.0.1.
type Sentinel struct {
	Addr     string // host:port
	Dir      string // working directory: sentinel.conf (which the sentinel rewrites) and sentinel.log
	Password string // required from clients; "" for none

	child // the current run; serialises Kill, Stop and Restart
	bin   string
	flag  []string // --sentinel when bin is redis-server
}

// startSentinel writes dir/sentinel.conf watching the master at masterAddr and starts a sentinel
// with it on a free port.
func startSentinel(dir, bin string, flag []string, opts SentinelOptions, masterAddr string) (*Sentinel, error) {
	dir, err := prepareDir(dir)
	if err != nil {
		return nil, fmt.Errorf("servers: sentinel dir: %w", err)
	}
	sn := &Sentinel{Dir: dir, Password: opts.SentinelPassword, child: child{name: "redis-sentinel"}, bin: bin, flag: flag}
	err = onFreePort(func(port int) error {
		if err := sn.writeConf(port, opts, masterAddr); err != nil {
			return err
		}
		return sn.start(port)
	})
	if err != nil {
		return nil, fmt.Errorf("servers: start redis sentinel: %w", err)
	}
	return sn, nil
}

// LogPath is the file the sentinel writes its log to.
func (sn *Sentinel) LogPath() string { return filepath.Join(sn.Dir, "sentinel.log") }

func (sn *Sentinel) confPath() string { return filepath.Join(sn.Dir, "sentinel.conf") }

func (sn *Sentinel) writeConf(port int, opts SentinelOptions, masterAddr string) error {
	host, mport, err := net.SplitHostPort(masterAddr)
	if err != nil {
		return err
	}
	set := opts.MasterSet
	var b strings.Builder
	b.WriteString("# Written by sigwatch internal/servers; the sentinel rewrites it as it learns.\n")
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\n", port, sn.Dir)
	fmt.Fprintf(&b, "sentinel monitor %s %s %s %d\n", set, host, mport, sentinelQuorum)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", set, sentinelDownAfter)
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", set, sentinelFailoverTimeout)
	fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", set)
	if opts.Password != "" {
		fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", set, opts.Password)
	}
	if opts.SentinelPassword != "" {
		fmt.Fprintf(&b, "requirepass %s\nsentinel sentinel-pass %s\n", opts.SentinelPassword, opts.SentinelPassword)
	}
	return os.WriteFile(sn.confPath(), []byte(b.String()), 0o644)
}

// start runs the sentinel with its config file and waits for PING. The port is in the config
// file, which a restart reuses as the sentinel last rewrote it. The caller holds sn.mu or owns
// sn alone.
func (sn *Sentinel) start(port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := append([]string{sn.confPath()}, sn.flag...)
	p, err := startProcess(sn.bin, args, sn.Dir, sn.LogPath())
	if err != nil {
		return err
	}
	if err := p.waitReady(func() error {
		_, err := redisDo(addr, sn.Password, "PING")
		return err
	}); err != nil {
		return err
	}
	sn.cmd, sn.Addr = p, addr
	return nil
}

// master returns the address this sentinel has for the master of set.
func (sn *Sentinel) master(set string) (string, error) {
	info, err := redisDo(sn.Addr, sn.Password, "INFO", "sentinel")
	if err != nil {
		return "", fmt.Errorf("sentinel %s: %w", sn.Addr, err)
	}
	// One line per master: masterN:name=<set>,status=ok,address=<host:port>,slaves=1,sentinels=3
	for _, line := range strings.Split(info, "\n") {
		_, fields, ok := strings.Cut(strings.TrimSpace(line), ":name="+set+",")
		if !ok {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			if a, ok := strings.CutPrefix(f, "address="); ok {
				return a, nil
			}
		}
	}
	return "", fmt.Errorf("sentinel %s does not monitor %q", sn.Addr, set)
}

// Kill stops the sentinel with SIGKILL and waits until it has exited.
func (sn *Sentinel) Kill() error { return sn.child.kill() }

// Stop asks the sentinel to shut down (SIGTERM) and waits; it kills it after 5s.
func (sn *Sentinel) Stop() error { return sn.child.stop() }

// Pause freezes the sentinel (SIGSTOP): its connections stay open but it answers nothing.
func (sn *Sentinel) Pause() error { return sn.child.signal(syscall.SIGSTOP) }

// Resume continues a paused sentinel.
func (sn *Sentinel) Resume() error { return sn.child.signal(syscall.SIGCONT) }

// Restart starts the sentinel again on the same port with the config it last wrote, and waits
// for PING.
func (sn *Sentinel) Restart() error {
	_, p, _ := net.SplitHostPort(sn.Addr)
	port, _ := strconv.Atoi(p)
	return sn.child.restart(func() error { return sn.start(port) })
}

// waitUntil polls ready every 20ms until it succeeds or d passes, and returns its last error.
func waitUntil(d time.Duration, ready func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := ready()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lastLine is the last non-empty line of s, to keep an INFO reply in an error short.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}
