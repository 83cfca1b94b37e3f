package servers

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

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
