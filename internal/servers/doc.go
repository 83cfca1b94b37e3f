// Package servers starts the real servers sigwatch talks to — redis-server, a Redis Cluster,
// mosquitto, an embedded nats-server and Prometheus Alertmanager — on 127.0.0.1 random free
// ports, each in a directory the caller owns. Tests (through internal/testenv), `sigwatch demo`
// and the bench harness use it, so it does not import testing.
//
// Child processes are started so that they die with the process that started them where the
// platform allows it (Linux: PR_SET_PDEATHSIG), so a crashed test leaves no server behind. Each
// child writes its output to a log file in its directory (see the LogPath methods).
//
// Files:
//
//   - servers.go: FreePort, LookPath and NotFoundError, LogTail: what every
//     server shares.
//   - redis.go: one redis-server (StartRedis): start, kill, stop, restart.
//   - redis_cluster.go: a Redis Cluster of child nodes (StartRedisCluster):
//     its start, its nodes, who serves which slot.
//   - redis_cluster_health.go: waiting for a cluster to be whole and its
//     replicas caught up (WaitHealthy, WaitReplicated).
//   - sentinel.go: a Redis master with replicas watched by Sentinels
//     (StartRedisSentinel), and failovers.
//   - replication.go: how far a Redis's replication has gone (ReplOffset), and
//     one command sent to it (Do).
//   - mosquitto.go: a mosquitto broker (StartMosquitto).
//   - nats.go: an embedded nats-server with JetStream (StartNATS), and
//     optionally a system account whose user sees its advisories.
//   - nats_process.go: a nats-server as its own process (StartNATSProcess),
//     built from natsd.
//   - nats_cluster.go: a nats-server cluster of child processes
//     (StartNATSCluster).
//   - alertmanager.go: a Prometheus Alertmanager, alone, with a receiver that
//     sends nowhere (StartAlertmanager), and its alerts API (Alerts,
//     PostAlerts).
//   - pause.go: pausing and resuming a server (SIGSTOP, SIGCONT), as a hung
//     host would.
//   - certs.go: test certificates and the TLS settings built on them
//     (WriteTestCerts, TLSFiles).
//   - proc_linux.go: children that die with their parent, in their own process
//     group (Linux).
//   - proc_other.go: the same elsewhere, without the parent-death signal.
package servers
