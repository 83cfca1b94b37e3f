package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sigwatch/sigwatch/internal/periodic"
	"github.com/sigwatch/sigwatch/internal/servers"
)

// idleShards are the shard counts of the idle scenario.
var idleShards = []int{16, 256, 1024}

// idleFamilies is how many timer families run a loop per shard in `sigwatch
// run`: the deadlines, the alarm's repeats and the generic timers.
const idleFamilies = 3

// idlePoll is the naive poller's period: what every shard loop of every
// family did before an idle shard slept until its head.
const idlePoll = 20 * time.Millisecond

// idle is scenario 10: what an installation with nothing due costs, at 16,
// 256 and 1,024 shards. sigwatch runs as `sigwatch run` with every role, as
// a process of its own, on a fresh installation (no device, no timer); the
// baseline is the naive design, a process whose loop on each shard of each
// family claims every 20 ms. Each side runs alone, in alternating order,
// rounds times; each figure is its lowest round, the spread is given.
func (r *runner) idle(ctx context.Context) error {
	sc := Scenario{ID: 10, Name: "idle", Title: "Idle installation: cost with nothing due",
		Baselines: []string{fmt.Sprintf("naive poller: a process of its own whose loop on each shard of each of the %d "+
			"families runs one claim (`ZRANGE … BYSCORE LIMIT`) every %v, the period every shard loop polled at "+
			"before idle shards slept until their head; no lease, no watermark, nothing else.", idleFamilies, idlePoll)}}
	bin, err := r.sigwatchBinary(ctx)
	if err != nil {
		return err
	}
	for _, n := range idleShards {
		var sw, nv []idleCost
		err := alternate(rounds, func(round int) error {
			c, err := r.idleSigwatch(ctx, bin, n, round)
			sw = append(sw, c)
			return err
		}, func(int) error {
			c, err := r.idlePoller(ctx, n)
			nv = append(nv, c)
			return err
		})
		if err != nil {
			return err
		}
		s, b := lowest(sw), lowest(nv)
		r.p.Printf("idle", "%d shards: sigwatch %s; naive poller %s (lowest of each)", n, s, b)
		var redisTarget, procTarget []Target
		switch n {
		case 256:
			redisTarget, procTarget = []Target{valueAtMost(1)}, []Target{valueAtMost(2)}
		case 1024:
			redisTarget, procTarget = []Target{valueAtMost(4)}, []Target{valueAtMost(4)}
		}
		f := newFigure(fmt.Sprintf("Redis commands/s, idle, %d shards", n), "/s", s.commands, "naive poller at 20 ms", b.commands)
		f.Detail = fmt.Sprintf("lowest of %d rounds each, the order alternated; sigwatch %s, naive poller %s", rounds, spread(sw, idleCost.cmds), spread(nv, idleCost.cmds))
		sc.Figures = append(sc.Figures, f)
		f = newFigure(fmt.Sprintf("Redis CPU, idle, %d shards", n), "% of a core", s.redis, "naive poller at 20 ms", b.redis, redisTarget...)
		f.Detail = fmt.Sprintf("Redis's own used_cpu over the window; sigwatch %s, naive poller %s", spread(sw, idleCost.redisCPU), spread(nv, idleCost.redisCPU))
		sc.Figures = append(sc.Figures, f)
		f = newFigure(fmt.Sprintf("process CPU, idle, %d shards", n), "% of a core", s.process, "naive poller at 20 ms", b.process, procTarget...)
		f.Detail = fmt.Sprintf("the sigwatch process (every role) against the poller's process; sigwatch %s, naive poller %s; "+
			"nats-server beside sigwatch: %.1f%%", spread(sw, idleCost.processCPU), spread(nv, idleCost.processCPU), s.nats)
		sc.Figures = append(sc.Figures, f)
	}
	sc.Notes = append(sc.Notes, fmt.Sprintf("each round is measured for %v once the process has taken every shard; "+
		"sigwatch's fixed part (ingest's watermark probe through the broker, every 250 ms while no scanner waits for it, "+
		"epoch and process reports, the timers' watermark, heartbeats) is the same at every shard count; what grows with "+
		"shards is one lease renewal per shard and family every lease_ttl/3 (sent in one round trip) and one claim per "+
		"idle shard and family every scanner.poll (10 s)", r.prof.IdleWindow))
	r.res.add(sc)
	return nil
}

// idleCost is what one side cost over one window, in /s and % of a core.
type idleCost struct {
	commands, redis, process, nats float64
}

func (c idleCost) cmds() float64       { return c.commands }
func (c idleCost) redisCPU() float64   { return c.redis }
func (c idleCost) processCPU() float64 { return c.process }

func (c idleCost) String() string {
	return fmt.Sprintf("%.0f Redis commands/s, Redis %.1f%%, process %.1f%%", c.commands, c.redis, c.process)
}

// lowest is the lowest of each measure over the rounds.
func lowest(cs []idleCost) idleCost {
	out := cs[0]
	for _, c := range cs[1:] {
		out.commands, out.redis = min(out.commands, c.commands), min(out.redis, c.redis)
		out.process, out.nats = min(out.process, c.process), min(out.nats, c.nats)
	}
	return out
}

// spread says the range of one measure over the rounds.
func spread(cs []idleCost, of func(idleCost) float64) string {
	vs := make([]float64, len(cs))
	for j, c := range cs {
		vs[j] = of(c)
	}
	return fmt.Sprintf("%s–%s", trimFloat(round1(slices.Min(vs))), trimFloat(round1(slices.Max(vs))))
}

func round1(v float64) float64 { return float64(int64(v*10+0.5)) / 10 }

// measureIdle samples Redis's command count and CPU, and the CPU of pid and
// of nats-server, over the profile's idle window.
func (r *runner) measureIdle(ctx context.Context, pid int) (idleCost, error) {
	count := func() (int64, error) {
		m, err := r.e.redisInfo(ctx, "stats")
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(m["total_commands_processed"], 10, 64)
	}
	c0, err := count()
	if err != nil {
		return idleCost{}, err
	}
	r0, p0, n0, t0 := r.e.redisCPU(ctx), childCPU(pid), childCPU(r.e.nats.pid()), time.Now()
	select {
	case <-ctx.Done():
		return idleCost{}, ctx.Err()
	case <-time.After(r.prof.IdleWindow):
	}
	c1, err := count()
	if err != nil {
		return idleCost{}, err
	}
	el := time.Since(t0).Seconds()
	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / el }
	// The two INFO calls of the count are the harness's own.
	return idleCost{commands: float64(c1-c0-2) / el, redis: pct(r.e.redisCPU(ctx) - r0),
		process: pct(childCPU(pid) - p0), nats: pct(childCPU(r.e.nats.pid()) - n0)}, nil
}

// idleSigwatch runs `sigwatch run` with every role on a fresh installation
// of n shards, waits until it holds every lease of every family, and
// measures it.
func (r *runner) idleSigwatch(ctx context.Context, bin string, n, round int) (idleCost, error) {
	if err := r.e.flush(ctx); err != nil {
		return idleCost{}, err
	}
	name := fmt.Sprintf("idle%d-%d-%d", n, round, time.Now().UnixNano())
	logPath := filepath.Join(r.e.dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return idleCost{}, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(),
		"SIGWATCH_REDIS_ADDRS="+r.e.redis.Addr, "SIGWATCH_REDIS_PREFIX="+name,
		"SIGWATCH_NATS_URL="+r.e.ni.URL, "SIGWATCH_NATS_STREAM="+strings.ToUpper(strings.ReplaceAll(name, "-", "_")),
		"SIGWATCH_NATS_PREFIX="+name, "SIGWATCH_MQTT_BROKERS="+r.e.mosq.URL, "SIGWATCH_MQTT_CLIENT_ID="+name,
		"SIGWATCH_HTTP_ADDR=127.0.0.1:0", "SIGWATCH_SHARDS_INITIAL="+strconv.Itoa(n))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return idleCost{}, fmt.Errorf("bench: start sigwatch: %w", err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	// Every family's lease of every shard is taken.
	owners := func() int {
		n := 0
		var cur uint64
		for {
			e, err := r.e.rc.Do(ctx, r.e.rc.B().Scan().Cursor(cur).Match(name+"*owner*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				return -1
			}
			n += len(e.Elements)
			if cur = e.Cursor; cur == 0 {
				return n
			}
		}
	}
	if !waitFor(ctx, 60*time.Second, func() bool { return owners() >= idleFamilies*n }) {
		return idleCost{}, fmt.Errorf("bench: sigwatch did not take the %d leases of %d shards within 60s; end of %s:\n%s",
			idleFamilies*n, n, logPath, servers.LogTail(logPath))
	}
	// What the start-up did (vetting, first claims) is over.
	select {
	case <-ctx.Done():
		return idleCost{}, ctx.Err()
	case <-time.After(3 * time.Second):
	}
	return r.measureIdle(ctx, cmd.Process.Pid)
}

// idlePoller runs the naive poller over n shards as a child and measures it.
func (r *runner) idlePoller(ctx context.Context, n int) (idleCost, error) {
	if err := r.e.flush(ctx); err != nil {
		return idleCost{}, err
	}
	c, err := startChild(r.e.dir, "poller", pollerConfig{Redis: r.e.redis.Addr, Shards: n, Families: idleFamilies, Every: idlePoll})
	if err != nil {
		return idleCost{}, err
	}
	defer c.stop(5 * time.Second)
	select {
	case <-ctx.Done():
		return idleCost{}, ctx.Err()
	case <-time.After(time.Second):
	}
	return r.measureIdle(ctx, c.pid())
}

// pollerConfig configures the naive poller child.
type pollerConfig struct {
	Redis    string
	Shards   int
	Families int
	Every    time.Duration
}

// pollerChild runs one loop per shard and family, each claiming every
// Every, until standard input closes.
func pollerChild() error {
	var cfg pollerConfig
	if err := json.Unmarshal([]byte(os.Getenv(childConfigEnv)), &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	rc, err := newRedisClient(cfg.Redis)
	if err != nil {
		return err
	}
	defer rc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for f := range cfg.Families {
		for i := range cfg.Shards {
			key := fmt.Sprintf("naive:{%d}:f%d", i, f)
			wg.Go(func() {
				periodic.Run(ctx, cfg.Every, func(time.Time) {
					now := strconv.FormatInt(time.Now().UnixMilli(), 10)
					_ = rc.Do(ctx, rc.B().Zrange().Key(key).Min("-inf").Max(now).Byscore().Limit(0, 256).Withscores().Build()).Error()
				})
			})
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	cancel()
	wg.Wait()
	return nil
}

// sigwatchBinary builds the service once per run, from the module beside
// bench/, as `make build` does.
func (r *runner) sigwatchBinary(ctx context.Context) (string, error) {
	bin := filepath.Join(r.e.dir, "sigwatch")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	// The service's module (bench/ replaces it with ../) builds with its
	// own dependencies.
	dir, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/sigwatch/sigwatch").Output()
	if err != nil {
		return "", fmt.Errorf("bench: find the sigwatch module: %w", err)
	}
	out, err := exec.CommandContext(ctx, "go", "build", "-C", strings.TrimSpace(string(dir)), "-o", bin, "./cmd/sigwatch").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("bench: build sigwatch: %v\n%s", err, out)
	}
	return bin, nil
}
