package bench

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sigwatch/sigwatch/internal/servers"
)

// natsR3 is a 3-node NATS cluster the burst runs against with every stream
// at 3 replicas, as docs/operations.md tells production to run.
type natsR3 struct {
	c    *servers.NATSCluster
	nc   *nats.Conn
	pids []int
}

// startR3 starts the cluster in the run's directory.
func (r *runner) startR3() (*natsR3, error) {
	c, err := servers.StartNATSCluster(filepath.Join(r.e.dir, "nats-r3"), 3)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1))
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("bench: connect nats cluster: %w", err)
	}
	g := &natsR3{c: c, nc: nc}
	for j := range 3 {
		if pid := findProcess(filepath.Join(c.Dir, fmt.Sprintf("node%d", j), "jetstream")); pid > 0 {
			g.pids = append(g.pids, pid)
		}
	}
	return g, nil
}

func (g *natsR3) stop() {
	g.nc.Close()
	g.c.Stop()
}

// withR3 runs f with the burst's sides publishing to g at 3 replicas.
func (r *runner) withR3(g *natsR3, f func() error) error {
	r.r3 = g
	defer func() { r.r3 = nil }()
	return f()
}

// natsConn is the connection the burst's sides publish on: the run's
// server, or the cluster within withR3.
func (r *runner) natsConn() *nats.Conn {
	if r.r3 != nil {
		return r.r3.nc
	}
	return r.e.nc
}

// replicas is the stream replication the burst's sides use.
func (r *runner) replicas() int {
	if r.r3 != nil {
		return 3
	}
	return 1
}

// burstR3 is the burst's headline row on 3 replicas: sigwatch against raw
// asynchronous publishing into a stream of 3 replicas, best of rounds
// each, the order alternated.
func (r *runner) burstR3(ctx context.Context, n int, body []byte) (*Figure, error) {
	g, err := r.startR3()
	if err != nil {
		return nil, err
	}
	defer g.stop()
	var sws, raws []cpuRun
	err = r.withR3(g, func() error {
		for round := range rounds {
			sw := func() error {
				d, _, err := r.burstSigwatch(ctx, n)
				sws = append(sws, cpuRun{d, r.burstCPU})
				return err
			}
			raw := func() error {
				m := r.newCPUMeter(ctx, nil)
				s0 := m.sample()
				d, err := r.burstRaw(ctx, n, body, rawPlain)
				raws = append(raws, cpuRun{d, m.since(s0)})
				return err
			}
			if round%2 == 1 {
				sw, raw = raw, sw
			}
			if err := sw(); err != nil {
				return err
			}
			if err := raw(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sw, raw := bestRun(sws), bestRun(raws)
	f := newFigure(fmt.Sprintf("%s expiries → all lost events in JetStream, 3 replicas", groupThousands(int64(n))), "events/s",
		float64(n)/sw.d.Seconds(), "raw JetStream publish, 3 replicas", float64(n)/raw.d.Seconds(), ratioAtLeast(0.8))
	f.Detail = fmt.Sprintf("a 3-node NATS cluster on this machine, the event stream and the durable registry at 3 replicas; "+
		"best of %d each, the order alternated: sigwatch %s (runs %s), %s; raw %s (runs %s), %s",
		rounds, sw.d.Round(time.Millisecond), durations(runsOf(sws)), sw.cpu, raw.d.Round(time.Millisecond), durations(runsOf(raws)), raw.cpu)
	return &f, nil
}

// cpuRun is one timed run and who was busy during it.
type cpuRun struct {
	d   time.Duration
	cpu cpuShares
}

// bestRun is the fastest of rs.
func bestRun(rs []cpuRun) cpuRun {
	return slices.MinFunc(rs, func(a, b cpuRun) int { return cmp.Compare(a.d, b.d) })
}

// runsOf is the times of rs.
func runsOf(rs []cpuRun) []time.Duration {
	out := make([]time.Duration, len(rs))
	for j, x := range rs {
		out[j] = x.d
	}
	return out
}
