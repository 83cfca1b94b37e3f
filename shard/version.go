package shard

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/sigwatch/sigwatch/internal/minversion"
)

// MinRedisVersion is the oldest Redis sigwatch works with: its scripts use
// ZADD GT, ZMSCORE and ZRANGE BYSCORE, all new in 6.2.
const MinRedisVersion = "6.2"

// CheckVersion refuses a Redis older than MinRedisVersion, in one line
// naming the version found, where, and what is needed. Every node the
// client knows is asked (all masters of a Redis Cluster), since an old one
// would fail only once a device hashes to it.
func (s *Store) CheckVersion(ctx context.Context) error {
	nodes := s.c.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		info, err := nodes[addr].Do(ctx, nodes[addr].B().Info().Section("server").Build()).ToString()
		if err != nil {
			return fmt.Errorf("redis %s: version check: %w", addr, err)
		}
		if err := checkRedisVersion(addr, infoField(info, "redis_version")); err != nil {
			return err
		}
	}
	return nil
}

// checkRedisVersion says what to do when version, found at addr, is older
// than MinRedisVersion.
func checkRedisVersion(addr, version string) error {
	newer, ok := minversion.AtLeast(version, MinRedisVersion)
	switch {
	case !ok:
		return fmt.Errorf("redis at %s reports no version sigwatch can read (%q): sigwatch needs Redis %s or newer", addr, version, MinRedisVersion)
	case !newer:
		return fmt.Errorf("redis %s at %s: sigwatch needs %s or newer (install a newer redis-server, e.g. the redis:7 container image or https://redis.io/downloads)",
			version, addr, MinRedisVersion)
	}
	return nil
}

// infoField is the value of name in an INFO reply ("" if absent).
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
