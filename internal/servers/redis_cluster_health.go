package servers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"time"
)

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
