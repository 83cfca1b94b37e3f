package servers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
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
	err = onFreePort(func(port int) error {
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

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// ClusterOptions configures StartRedisClusterOpts.
type ClusterOptions struct {
	// Masters is the number of masters, at least 3 (as redis-cli requires).
	Masters int
	// Replicas is the number of replicas of each master.
	Replicas int
	// AppendOnly turns on every node's append-only file and Redis's default RDB save points, so
	// that a node keeps its data across Kill and Restart. Without it nothing is written to disk,
	// and a restarted node has only what it syncs from its master.
	AppendOnly bool
	// AppendFsync is appendfsync with AppendOnly: "always", "everysec" (the default) or "no".
	AppendFsync string
	// NodeTimeout is cluster-node-timeout: how long a node may not answer before the others
	// count it as failing and its replica takes over. Default 1s.
	NodeTimeout time.Duration
	// ExtraArgs are appended to every node's command line.
	ExtraArgs []string
}

// RedisCluster is a Redis Cluster, every node a child process: masters and their replicas.
// Which node is a master changes with failovers; Masters, MasterForSlot and ReplicasOf ask the
// cluster.
type RedisCluster struct {
	Nodes []*Redis
	Addrs []string // the nodes' addresses, in the order of Nodes
	opts  ClusterOptions
}

// StartRedisCluster starts masters redis-server nodes (at least 3, as redis-cli requires)
// without replicas in dir/node<i>, joins them with `redis-cli --cluster create` and returns once
// the cluster is healthy (see WaitHealthy).
func StartRedisCluster(dir string, masters int) (*RedisCluster, error) {
	return StartRedisClusterOpts(dir, ClusterOptions{Masters: masters, NodeTimeout: 2 * time.Second})
}

// StartRedisClusterOpts starts opts.Masters × (1 + opts.Replicas) nodes in dir/node<i>, joins
// them with `redis-cli --cluster create --cluster-replicas`, and returns once the cluster is
// healthy (see WaitHealthy): every node knows every other and sees the same masters and
// replicas, every slot is served, and every replica is in sync with its master.
func StartRedisClusterOpts(dir string, opts ClusterOptions) (*RedisCluster, error) {
	if opts.Masters < 3 {
		return nil, fmt.Errorf("servers: redis cluster needs at least 3 masters, got %d", opts.Masters)
	}
	if opts.Replicas < 0 {
		return nil, fmt.Errorf("servers: redis cluster replicas must not be negative, got %d", opts.Replicas)
	}
	switch opts.AppendFsync {
	case "":
		opts.AppendFsync = "everysec"
	case "always", "everysec", "no":
	default:
		return nil, fmt.Errorf("servers: redis cluster appendfsync %q: want always, everysec or no", opts.AppendFsync)
	}
	if opts.NodeTimeout <= 0 {
		opts.NodeTimeout = time.Second
	}
	cli, err := LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{opts: opts}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	for i := range opts.Masters * (1 + opts.Replicas) {
		n, err := c.startNode(filepath.Join(dir, fmt.Sprintf("node%d", i)))
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}

	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(opts.Replicas), "--cluster-yes")
	if out, err := runCommand(cli, args...); err != nil {
		return nil, fmt.Errorf("servers: redis-cli --cluster create: %w\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// startNode starts one cluster-enabled node. The cluster bus gets its own free port
// (cluster-port) rather than the default port+10000, which can be above 65535 or taken; it is
// on the command line, so Restart keeps it, and nodes.conf in dir keeps the node's identity.
func (c *RedisCluster) startNode(dir string) (n *Redis, err error) {
	err = onFreePort(func(busPort int) error {
		extra := []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(busPort),
			"--cluster-node-timeout", strconv.FormatInt(c.opts.NodeTimeout.Milliseconds(), 10),
			// A replica's full sync starts at once rather than after the default 5s wait for
			// other replicas to share the transfer.
			"--repl-diskless-sync-delay", "0",
		}
		if c.opts.AppendOnly {
			extra = append(extra, "--appendfsync", c.opts.AppendFsync)
		}
		n, err = StartRedis(dir, RedisOptions{
			Persist:   c.opts.AppendOnly,
			ExtraArgs: append(extra, c.opts.ExtraArgs...),
		})
		return err
	})
	return n, err
}

// Kill kills node n with SIGKILL, as a crash would, and waits until it has exited. The other
// nodes notice after NodeTimeout, and a replica of n, if it was a master, takes over its slots.
func (c *RedisCluster) Kill(n *Redis) error { return n.Kill() }

// Restart starts a killed or stopped node n again on the same ports and directory. It rejoins
// the cluster as whatever the cluster has made of it meanwhile: a node whose slots a replica
// took over comes back as that replica's replica. It returns once n answers PING, not once it
// has rejoined; WaitHealthy waits for that.
func (c *RedisCluster) Restart(n *Redis) error { return n.Restart() }

// Stop stops every node, in parallel.
func (c *RedisCluster) Stop() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Stop()
		}()
	}
	wg.Wait()
}

// clusterNode is one line of CLUSTER NODES: one node as the node asked sees it.
type clusterNode struct {
	id, addr    string // addr is host:port, without the bus port
	master      bool
	failing     bool   // flagged fail or fail? (not reachable, as far as the node asked knows)
	masterID    string // a replica's master; "" for a master
	configEpoch int64
	slots       [][2]int // inclusive ranges served
}

// parseClusterNodes reads the reply of CLUSTER NODES.
func parseClusterNodes(reply string) ([]clusterNode, error) {
	var nodes []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(reply), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("servers: CLUSTER NODES line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := strings.Split(f[2], ",")
		n := clusterNode{id: f[0], addr: addr}
		for _, fl := range flags {
			switch fl {
			case "master":
				n.master = true
			case "fail", "fail?":
				n.failing = true
			}
		}
		if f[3] != "-" {
			n.masterID = f[3]
		}
		n.configEpoch, _ = strconv.ParseInt(f[6], 10, 64)
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") { // a slot being migrated or imported
				continue
			}
			lo, hi, isRange := strings.Cut(s, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("servers: CLUSTER NODES slots %q", s)
			}
			n.slots = append(n.slots, [2]int{a, b})
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// node returns the node of c at addr, or nil.
func (c *RedisCluster) node(addr string) *Redis {
	for _, n := range c.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// views asks every running node for CLUSTER NODES. Nodes that do not answer (paused, still
// loading) are left out; it fails only when none answers.
func (c *RedisCluster) views() (map[*Redis][]clusterNode, error) {
	views := make(map[*Redis][]clusterNode)
	var lastErr error
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		reply, err := redisDo(n.Addr, "", "CLUSTER", "NODES")
		if err == nil {
			var v []clusterNode
			if v, err = parseClusterNodes(reply); err == nil {
				views[n] = v
				continue
			}
		}
		lastErr = fmt.Errorf("%s: %w", n.Addr, err)
	}
	if len(views) == 0 {
		return nil, fmt.Errorf("servers: no redis cluster node answers CLUSTER NODES: %v", lastErr)
	}
	return views, nil
}

// slotOwners returns the master of every slot, as the cluster settles it: of the claims the
// answering nodes know of, the one with the highest config epoch wins. A slot nobody claims has
// a nil master. The master may be a node that was killed and not yet replaced.
func (c *RedisCluster) slotOwners() ([clusterSlots]*Redis, error) {
	var owners [clusterSlots]*Redis
	var epochs [clusterSlots]int64
	views, err := c.views()
	if err != nil {
		return owners, err
	}
	for _, v := range views {
		for _, cn := range v {
			if !cn.master {
				continue
			}
			for _, r := range cn.slots {
				for s := r[0]; s <= r[1]; s++ {
					if owners[s] == nil || cn.configEpoch > epochs[s] {
						owners[s], epochs[s] = c.node(cn.addr), cn.configEpoch
					}
				}
			}
		}
	}
	return owners, nil
}

// Masters returns the nodes that serve slots, in the order of Nodes, as the cluster sees them
// now. Right after a Kill that includes the killed master until a replica has taken over;
// WaitHealthy waits for that.
func (c *RedisCluster) Masters() ([]*Redis, error) {
	owners, err := c.slotOwners()
	if err != nil {
		return nil, err
	}
	var masters []*Redis
	for _, n := range c.Nodes {
		if slices.Contains(owners[:], n) {
			masters = append(masters, n)
		}
	}
	return masters, nil
}

// MasterForSlot returns the node that serves slot, as the cluster sees it now.
func (c *RedisCluster) MasterForSlot(slot int) (*Redis, error) {
	if slot < 0 || slot >= clusterSlots {
		return nil, fmt.Errorf("servers: slot %d out of range", slot)
	}
	owners, err := c.slotOwners()
	if err != nil {
		return nil, err
	}
	if owners[slot] == nil {
		return nil, fmt.Errorf("servers: no redis cluster node serves slot %d", slot)
	}
	return owners[slot], nil
}

// Slot returns the hash slot of key, as a running node computes it.
func (c *RedisCluster) Slot(key string) (int, error) {
	var lastErr error
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		reply, err := redisDo(n.Addr, "", "CLUSTER", "KEYSLOT", key)
		if err == nil {
			return strconv.Atoi(reply)
		}
		lastErr = err
	}
	return 0, fmt.Errorf("servers: CLUSTER KEYSLOT %s: %v", key, lastErr)
}

// MasterOf returns the node that serves key, as the cluster sees it now.
func (c *RedisCluster) MasterOf(key string) (*Redis, error) {
	slot, err := c.Slot(key)
	if err != nil {
		return nil, err
	}
	return c.MasterForSlot(slot)
}

// ReplicasOf returns the replicas of master m, in the order of Nodes, as the first running node
// that answers sees them; after WaitHealthy every node sees the same. A replica that was killed
// is included while the cluster still counts it as m's.
func (c *RedisCluster) ReplicasOf(m *Redis) ([]*Redis, error) {
	var lastErr error
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		reply, err := redisDo(n.Addr, "", "CLUSTER", "NODES")
		if err != nil {
			lastErr = err
			continue
		}
		v, err := parseClusterNodes(reply)
		if err != nil {
			return nil, err
		}
		roles := rolesOf(v)
		var replicas []*Redis
		for _, r := range c.Nodes {
			if roles[r.Addr] == m.Addr {
				replicas = append(replicas, r)
			}
		}
		return replicas, nil
	}
	return nil, fmt.Errorf("servers: no redis cluster node answers CLUSTER NODES: %v", lastErr)
}

// rolesOf maps the address of every node of a view to its master's address, "" for a master.
func rolesOf(v []clusterNode) map[string]string {
	addrOf := make(map[string]string, len(v))
	for _, cn := range v {
		addrOf[cn.id] = cn.addr
	}
	roles := make(map[string]string, len(v))
	for _, cn := range v {
		roles[cn.addr] = ""
		if !cn.master {
			roles[cn.addr] = addrOf[cn.masterID]
		}
	}
	return roles
}

// WaitHealthy returns once the cluster is whole again, or fails when ctx ends with the reason it
// is not: every running node reports cluster_state:ok and knows every node of c; every running
// node sees every slot served by the same master, which is running and not flagged failing; and
// every running node sees every node in the same role (master, or replica of the same master),
// so that ReplicasOf does not depend on whom it asks; and every running replica is in sync with
// its master (master_link_status:up).
func (c *RedisCluster) WaitHealthy(ctx context.Context) error {
	for {
		err := c.healthy()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("servers: redis cluster not healthy: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// healthy says why the cluster is not whole, or returns nil; see WaitHealthy.
func (c *RedisCluster) healthy() error {
	wantKnown := fmt.Sprintf("cluster_known_nodes:%d", len(c.Nodes))
	running := 0
	var owners [clusterSlots]string
	var roles map[string]string // as the first node asked sees them
	var rolesBy string
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		running++
		info, err := redisDo(n.Addr, "", "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("node %s: CLUSTER INFO: %w", n.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, wantKnown) {
			return fmt.Errorf("node %s: want cluster_state:ok and %s, got\n%s", n.Addr, wantKnown, info)
		}
		reply, err := redisDo(n.Addr, "", "CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("node %s: CLUSTER NODES: %w", n.Addr, err)
		}
		v, err := parseClusterNodes(reply)
		if err != nil {
			return err
		}
		if r := rolesOf(v); roles == nil {
			roles, rolesBy = r, n.Addr
		} else if !maps.Equal(r, roles) {
			return fmt.Errorf("node %s sees roles (node: its master) %v, node %s sees %v", n.Addr, r, rolesBy, roles)
		}
		served := 0
		for _, cn := range v {
			if !cn.master || len(cn.slots) == 0 {
				continue
			}
			if m := c.node(cn.addr); cn.failing || m == nil || !m.running() {
				return fmt.Errorf("node %s: slots served by %s, which is down", n.Addr, cn.addr)
			}
			for _, r := range cn.slots {
				for s := r[0]; s <= r[1]; s++ {
					if owners[s] != "" && owners[s] != cn.addr {
						return fmt.Errorf("node %s: slot %d served by %s, another node says %s", n.Addr, s, cn.addr, owners[s])
					}
					owners[s] = cn.addr
					served++
				}
			}
		}
		if served != clusterSlots {
			return fmt.Errorf("node %s: %d of %d slots served", n.Addr, served, clusterSlots)
		}
		repl, err := redisDo(n.Addr, "", "INFO", "replication")
		if err != nil {
			return fmt.Errorf("node %s: INFO replication: %w", n.Addr, err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("node %s: replica not in sync with its master", n.Addr)
		}
	}
	if running == 0 {
		return errors.New("no node is running")
	}
	return nil
}

// WaitReplicated returns once every running replica has received everything its master has
// (their replication offsets are equal), or fails when ctx ends. Called before a Kill, it makes
// what the killed master acknowledged survive the failover, as a synchronously replicated store
// would; without it the last writes before a kill may be lost, as in production.
func (c *RedisCluster) WaitReplicated(ctx context.Context) error {
	for {
		err := c.replicated()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("servers: redis cluster not replicated: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// replicated says which replica lags behind its master, or returns nil; see WaitReplicated.
// Masters are read before their replicas, so a replica that caught up with writes made after
// the read passes too.
func (c *RedisCluster) replicated() error {
	masterOffset := map[string]int64{}
	var replicas []string
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		repl, err := redisDo(n.Addr, "", "INFO", "replication")
		if err != nil {
			return fmt.Errorf("node %s: INFO replication: %w", n.Addr, err)
		}
		if infoField(repl, "role") == "master" {
			masterOffset[n.Addr], _ = strconv.ParseInt(infoField(repl, "master_repl_offset"), 10, 64)
		} else {
			replicas = append(replicas, n.Addr)
		}
	}
	for _, addr := range replicas {
		repl, err := redisDo(addr, "", "INFO", "replication")
		if err != nil {
			return fmt.Errorf("node %s: INFO replication: %w", addr, err)
		}
		master := net.JoinHostPort(infoField(repl, "master_host"), infoField(repl, "master_port"))
		want, ok := masterOffset[master]
		if !ok {
			continue // its master is down; there is nothing to catch up with
		}
		got, _ := strconv.ParseInt(infoField(repl, "slave_repl_offset"), 10, 64)
		if infoField(repl, "master_link_status") != "up" || got < want {
			return fmt.Errorf("replica %s at offset %d, link %s; its master %s at %d",
				addr, got, infoField(repl, "master_link_status"), master, want)
		}
	}
	return nil
}

// infoField returns the value of field in an INFO reply, or "".
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			return v
		}
	}
	return ""
}
