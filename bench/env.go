package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/rueidis"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// env is the servers of one run and the clients the harness shares.
type env struct {
	dir   string
	redis *servers.Redis
	mosq  *servers.Mosquitto
	nats  *child
	ni    natsInfo
	rc    rueidis.Client // shared by every scenario, as sigwatch shares one
	nc    *nats.Conn
}

func startEnv(ctx context.Context, dir string, p *progress) (_ *env, err error) {
	e := &env{dir: dir}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.redis, err = servers.StartRedis(filepath.Join(dir, "redis"), servers.RedisOptions{}); err != nil {
		return nil, err
	}
	if e.mosq, err = servers.StartMosquitto(filepath.Join(dir, "mosquitto"), servers.MosquittoOptions{}); err != nil {
		return nil, err
	}
	natsDir := filepath.Join(dir, "nats")
	if e.nats, err = startChild(dir, "nats", struct{ Dir string }{natsDir}); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(e.nats.first), &e.ni); err != nil {
		return nil, fmt.Errorf("bench: nats child said %q: %w", e.nats.first, err)
	}
	if e.rc, err = newRedisClient(e.redis.Addr); err != nil {
		return nil, err
	}
	if e.nc, err = nats.Connect(e.ni.URL, nats.MaxReconnects(-1)); err != nil {
		return nil, fmt.Errorf("bench: connect nats: %w", err)
	}
	p.Printf("setup", "redis %s, mosquitto %s, nats %s (mqtt %s)", e.redis.Addr, e.mosq.Addr, e.ni.URL, e.ni.MQTTURL)
	return e, nil
}

// newRedisClient returns a client configured as sigwatch configures its own.
func newRedisClient(addr string) (rueidis.Client, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("bench: redis client: %w", err)
	}
	return c, nil
}

// close stops everything, clients before servers.
func (e *env) close() {
	if e.nc != nil {
		e.nc.Close()
	}
	if e.rc != nil {
		e.rc.Close()
	}
	if e.nats != nil {
		e.nats.stop(10 * time.Second)
	}
	if e.mosq != nil {
		e.mosq.Stop()
	}
	if e.redis != nil {
		e.redis.Stop()
	}
}

// flush empties Redis, so each scenario starts from the same state.
func (e *env) flush(ctx context.Context) error {
	if err := e.rc.Do(ctx, e.rc.B().Flushall().Sync().Build()).Error(); err != nil {
		return fmt.Errorf("bench: flushall: %w", err)
	}
	return nil
}

// redisInfo returns the fields of one INFO section.
func (e *env) redisInfo(ctx context.Context, section string) (map[string]string, error) {
	s, err := e.rc.Do(ctx, e.rc.B().Info().Section(section).Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("bench: redis info %s: %w", section, err)
	}
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			m[k] = v
		}
	}
	return m, nil
}

// redisCPU returns the CPU time Redis has used (user + system, all threads).
func (e *env) redisCPU(ctx context.Context) time.Duration {
	m, err := e.redisInfo(ctx, "cpu")
	if err != nil {
		return 0
	}
	u, _ := strconv.ParseFloat(m["used_cpu_user"], 64)
	s, _ := strconv.ParseFloat(m["used_cpu_sys"], 64)
	return time.Duration((u + s) * float64(time.Second))
}

// usedMemory returns Redis's used_memory in bytes.
func (e *env) usedMemory(ctx context.Context) (int64, error) {
	m, err := e.redisInfo(ctx, "memory")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(m["used_memory"], 10, 64)
}

// Machine describes where a run happened.
type Machine struct {
	Cores    int     `json:"cores"`
	CPU      string  `json:"cpu,omitempty"`
	MemoryGB float64 `json:"memory_gb"`
	OS       string  `json:"os"`
	// LoadAtStart is the 1, 5 and 15-minute load average before the run
	// started anything: other work on a shared machine adds noise.
	LoadAtStart string            `json:"load_at_start,omitempty"`
	Versions    map[string]string `json:"versions"`
}

func machineInfo(e *env) Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Versions: map[string]string{}}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.MemoryGB = float64(int(kb/1024/1024*10+0.5)) / 10
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	m.Versions["go"] = runtime.Version()
	if info, err := e.redisInfo(context.Background(), "server"); err == nil {
		m.Versions["redis"] = info["redis_version"]
	}
	if bin, err := servers.LookPath("mosquitto"); err == nil {
		out, _ := exec.Command(bin, "-h").CombinedOutput()
		if line, _, _ := strings.Cut(string(out), "\n"); strings.HasPrefix(line, "mosquitto version") {
			m.Versions["mosquitto"] = strings.TrimPrefix(line, "mosquitto version ")
		}
	}
	m.Versions["nats-server"] = e.ni.Version
	if bi, ok := debug.ReadBuildInfo(); ok {
		names := map[string]string{
			"github.com/redis/rueidis": "rueidis", "github.com/nats-io/nats.go": "nats.go",
			"github.com/eclipse/paho.mqtt.golang": "paho", "github.com/hibiken/asynq": "asynq",
			"github.com/jackc/pgx/v5": "pgx",
		}
		for _, d := range bi.Deps {
			if name, ok := names[d.Path]; ok {
				m.Versions[name] = d.Version
			}
		}
	}
	return m
}

// loadAverage returns the first three fields of /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// gitCommit returns the commit the harness runs at, marked +dirty when the
// work tree has uncommitted changes.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not a git work tree)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += "+dirty"
	}
	return c
}

// waitFor polls cond every 10ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
